-- Release a lock if the caller still holds it; while someone waits, hand it over (a fair
-- lock) or free it and wake a waiter, who asks again like anyone else (a non-fair lock).
-- KEYS[1]  owner key
-- KEYS[2]  fence key
-- KEYS[3]  signal key (LIST that waiters BLPOP: at most one wake-up)
-- KEYS[4]  waiting key (flag raised by refused callers who will wait, see lock_acquire.lua;
--          its value: until when, in server ms, a plain wake-up is out whose waiter has not
--          asked yet; 1: none is)
-- ARGV[1]  identifier of the caller
-- ARGV[2]  lock TTL in milliseconds (of a hand-over, and the lifetime of an untaken wake-up)
-- ARGV[3]  1: hand the lock over to the waiter who pops the wake-up; 0: free it and wake one
--          (non-fair locks; and fair ones whose grants replicas must acknowledge)
-- Returns  1 when released, 0 when the caller no longer held the lock (nothing is changed).

-- How long a plain wake-up counts as out before its waiter asks (at most; no longer than the
-- wake-up itself lives): a woken waiter pauses 32 ms at most (protocol.RACE_BACKOFF_MAX), and
-- one that died meanwhile holds the others up no longer than this.
local WAKE_UP_OUT_MS = 1000

if redis.call('GET', KEYS[1]) ~= ARGV[1] then
    return 0
end
local waiting = redis.call('GET', KEYS[4])
if not waiting then
    -- Nobody waits: nothing to wake.
    redis.call('DEL', KEYS[1])
    return 1
end
if ARGV[3] == '1' then
    -- The hand-over goes to the waiter blocked longest (Redis serves BLPOP first come, first
    -- served). The lock is never free in between, so a newcomer cannot barge in: the
    -- waiter holds it as "<token>:<ttl>:<identifier>" says, without asking again.
    local token = redis.call('INCR', KEYS[2])
    -- Only the releaser could derive it, and it is unique per grant.
    local identifier = redis.sha1hex(ARGV[1] .. ':' .. token)
    redis.call('SET', KEYS[1], identifier, 'PX', ARGV[2])
    redis.call('DEL', KEYS[3])
    redis.call('RPUSH', KEYS[3], token .. ':' .. ARGV[2] .. ':' .. identifier)
    if waiting ~= '1' then
        -- The next non-fair release wakes a waiter: a plain wake-up on the list is replaced.
        redis.call('SET', KEYS[4], 1, 'KEEPTTL')
    end
else
    -- Free: the woken waiter asks again, and a newcomer may be first.
    redis.call('DEL', KEYS[1])
    local time = redis.call('TIME')
    local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
    if tonumber(waiting) > now then
        -- A waiter woken by an earlier release has not asked yet and will (or the wake-up
        -- still waits on the list for the next one to block): waking another would only add
        -- a failed try while the lock is busy.
        return 1
    end
    redis.call('DEL', KEYS[3])
    redis.call('RPUSH', KEYS[3], 1)
    redis.call('SET', KEYS[4], now + math.min(WAKE_UP_OUT_MS, tonumber(ARGV[2])), 'KEEPTTL')
end
-- An untaken wake-up ends with the hand-over it carries.
redis.call('PEXPIRE', KEYS[3], ARGV[2])
return 1
