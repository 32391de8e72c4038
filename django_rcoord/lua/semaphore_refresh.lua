-- Extend the lease of a permit that is still held (an expired one is not re-added).
-- KEYS[1]  holders ZSET
-- ARGV[1]  identifier   ARGV[2] permit lease, ms, counted from now
-- Returns  1 when refreshed, 0 when the identifier holds no permit.

--! include _idle
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if not redis.call('ZSCORE', KEYS[1], ARGV[1]) then
    return 0
end
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[2]), ARGV[1])
keep_for_at_least(KEYS[1], tonumber(ARGV[2]) + IDLE_MS)
return 1
