-- Release a lock if the caller still holds it; while someone waits, hand it over (a fair
-- lock) or free it and wake a waiter, who asks again like anyone else (a non-fair lock).
-- KEYS[1]  owner key
-- KEYS[2]  fence key
-- KEYS[3]  signal key (LIST that waiters BLPOP: at most one wake-up)
-- KEYS[4]  waiting key (flag raised by refused callers who will wait, see lock_acquire.lua;
--          its value: until when, in server ms, a plain wake-up is out whose waiter has not
--          asked yet; 1: none is)
-- KEYS[5]  waiters key (ZSET: the line of waiters, see lock_acquire.lua; not read here)
-- KEYS[6]  granted key (STRING: the identifier of a hand-over its waiter has not confirmed
--          yet, for as long as the grant lease; lock_status.lua tells such a grant from a
--          holder by it)
-- ARGV[1]  identifier of the caller
-- ARGV[2]  lock TTL in milliseconds (the fence counter's lifetime is counted from it; a
--          hand-over and an untaken wake-up live no longer)
-- ARGV[3]  1: hand the lock over to the waiter who pops the wake-up; 0: free it and wake one
--          (non-fair locks; and fair ones whose grants replicas must acknowledge)
-- Returns  1 when released, 0 when the caller no longer held the lock (nothing is changed).

--! include _fence

-- How long a plain wake-up counts as out before its waiter asks (at most; no longer than the
-- wake-up itself lives): a woken waiter pauses 32 ms at most (protocol.RACE_BACKOFF_MAX), and
-- one that died meanwhile holds the others up no longer than this.
local WAKE_UP_OUT_MS = 1000
-- How long a hand-over holds the lock for the waiter it goes to before that waiter confirms
-- it (protocol.GRANT_LEASE): a waiter that popped it and then stalled, died or lost the
-- reply keeps the others out this long, not for the lock's whole TTL.
local GRANT_LEASE_MS = 1000

if redis.call('GET', KEYS[1]) ~= ARGV[1] then
    return 0
end
-- Whatever grant was in flight is over: its holder releases it, or gives it back.
redis.call('DEL', KEYS[6])
local waiting = redis.call('GET', KEYS[4])
if not waiting then
    -- Nobody waits: nothing to wake.
    redis.call('DEL', KEYS[1])
    return 1
end
if ARGV[3] == '1' then
    -- The hand-over goes to the waiter blocked longest (Redis serves BLPOP first come, first
    -- served). The lock is never free in between, so a newcomer cannot barge in: the
    -- waiter holds it as "<token>:<lease>:<identifier>" says once it extends it to its own TTL
    -- (a confirmation: a grant nobody confirms ends with its lease, and the next waiter to
    -- ask takes the lock).
    local token = string.format('%d', next_fencing_token(KEYS[2], ARGV[2]))
    -- Only the releaser could derive it, and it is unique per grant.
    local identifier = redis.sha1hex(ARGV[1] .. ':' .. token)
    local lease = math.min(GRANT_LEASE_MS, tonumber(ARGV[2]))
    redis.call('SET', KEYS[1], identifier, 'PX', lease)
    redis.call('SET', KEYS[6], identifier, 'PX', lease)
    redis.call('DEL', KEYS[3])
    redis.call('RPUSH', KEYS[3], token .. ':' .. lease .. ':' .. identifier)
    -- An untaken hand-over ends with its lease (a newcomer may claim it until then).
    redis.call('PEXPIRE', KEYS[3], lease)
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
    redis.call('PEXPIRE', KEYS[3], ARGV[2])
end
return 1
