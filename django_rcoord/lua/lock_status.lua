-- What operators see of a lock, read in one step: who holds it, in what state, who waits.
-- KEYS[1]  owner key
-- KEYS[2]  fence key
-- KEYS[3]  signal key (unused)
-- KEYS[4]  waiting key (the "someone waits" flag, see lock_acquire.lua)
-- KEYS[5]  waiters key (ZSET: the line, identifier -> until when it counts as waiting)
-- KEYS[6]  granted key (the identifier of a hand-over not confirmed yet)
-- Returns  {state, owner's PTTL in ms (-2: none, -1: no TTL), last fencing token or false,
--          waiters in the line, 1 if the flag stands else 0}; state: "free", "held" (by a
--          holder that took or confirmed it) or "granted" (handed over, not confirmed yet)
local owner = redis.call('GET', KEYS[1])
local state = 'free'
if owner then
    state = 'held'
    if redis.call('GET', KEYS[6]) == owner then
        state = 'granted'
    end
end
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
return {
    state,
    redis.call('PTTL', KEYS[1]),
    redis.call('GET', KEYS[2]),
    redis.call('ZCOUNT', KEYS[5], '(' .. now, '+inf'),
    redis.call('EXISTS', KEYS[4]),
}
