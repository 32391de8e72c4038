-- Count one hit in a sliding window, exactly: a log of the allowed hits' times.
-- KEYS[1]  log ZSET (member: a hit, score: its time, us of server time; expires with the last)
-- ARGV[1]  limit   ARGV[2] window length, us
-- Returns  {1 allowed | 0 refused, hits in the window including this one,
--           us until a next hit would be allowed (0: one would be now)}
-- Only allowed hits are logged, so the log holds at most limit entries (more only if the
-- limit was lowered), and a client refused while it keeps trying is let through again as
-- soon as its oldest logged hit leaves the window.
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000000 + tonumber(time[2])
local limit, window = tonumber(ARGV[1]), tonumber(ARGV[2])

-- (Numbers given to redis.call are sent with 17 digits: microseconds fit; Lua's own
-- tostring and .. keep 14.)
local logged = redis.call('ZCARD', KEYS[1])
if logged >= limit then
    -- Full, unless the hit whose leaving frees a place (oldest first) has left: then
    -- the expired hits are dropped. A refusal reads two commands and writes nothing.
    local deciding = redis.call('ZRANGE', KEYS[1], logged - limit, logged - limit, 'WITHSCORES')
    local frees_at = tonumber(deciding[2]) + window
    if frees_at > now then
        return {0, logged + 1, frees_at - now}
    end
end
logged = logged - redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - window)

-- Hits in the same microsecond need members of their own.
local member, suffix = now, 0
while redis.call('ZADD', KEYS[1], 'NX', now, member) == 0 do
    suffix = suffix + 1
    member = string.format('%.0f-%d', now, suffix)
end
logged = logged + 1
redis.call('PEXPIRE', KEYS[1], math.ceil(window / 1000))

-- The wait for a next hit: until the log holds limit - 1 hits again.
local wait = 0
if logged >= limit then
    local leaving = redis.call('ZRANGE', KEYS[1], logged - limit, logged - limit, 'WITHSCORES')
    wait = math.max(0, tonumber(leaving[2]) + window - now)
end
return {1, logged, wait}
