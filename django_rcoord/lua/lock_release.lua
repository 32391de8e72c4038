-- Release a lock if the caller still holds it; while someone waits, hand it over (a fair
-- lock) or free it and wake a waiter, who asks again like anyone else (a non-fair lock).
-- KEYS[1]  owner key
-- KEYS[2]  fence key
-- KEYS[3]  signal key (LIST that waiters BLPOP: at most one wake-up)
-- KEYS[4]  waiting key (flag raised by refused callers who will wait, see lock_acquire.lua)
-- ARGV[1]  identifier of the caller
-- ARGV[2]  lock TTL in milliseconds (of a hand-over, and the lifetime of an untaken wake-up)
-- ARGV[3]  1: hand the lock over to the waiter who pops the wake-up; 0: free it and wake one
--          (non-fair locks; and fair ones whose grants replicas must acknowledge)
-- Returns  1 when released, 0 when the caller no longer held the lock (nothing is changed).
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
    return 0
end
if redis.call('EXISTS', KEYS[4]) == 0 then
    -- Nobody waits: nothing to wake.
    redis.call('DEL', KEYS[1])
    return 1
end
-- The wake-up goes to the waiter blocked longest (Redis serves BLPOP first come, first
-- served). Handed over, the lock is never free in between, so a newcomer cannot barge in:
-- the waiter holds it as "<token>:<ttl>:<identifier>" says, without asking again.
redis.call('DEL', KEYS[3])
if ARGV[3] == '1' then
    local token = redis.call('INCR', KEYS[2])
    -- Only the releaser could derive it, and it is unique per grant.
    local identifier = redis.sha1hex(ARGV[1] .. ':' .. token)
    redis.call('SET', KEYS[1], identifier, 'PX', ARGV[2])
    redis.call('RPUSH', KEYS[3], token .. ':' .. ARGV[2] .. ':' .. identifier)
else
    -- Free: the woken waiter asks again, and a newcomer may be first.
    redis.call('DEL', KEYS[1])
    redis.call('RPUSH', KEYS[3], 1)
end
-- An untaken wake-up ends with the hand-over it carries.
redis.call('PEXPIRE', KEYS[3], ARGV[2])
return 1
