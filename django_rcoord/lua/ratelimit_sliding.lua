-- Count one hit in a sliding window, exactly: a log of the allowed hits' times.
-- KEYS[1]  log ZSET (member: a hit, score: its time, us of server time; expires with the last)
-- ARGV[1]  limit   ARGV[2] window length, us
-- Returns  {1 allowed | 0 refused, hits in the window including this one,
--           us until a next hit would be allowed (0: one would be now)}
-- Only allowed hits are logged: a client refused while it keeps trying is let through
-- again as soon as its oldest logged hit leaves the window.
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000000 + tonumber(time[2])
local limit, window = tonumber(ARGV[1]), tonumber(ARGV[2])

-- (Numbers are formatted by hand: Lua writes them with 14 digits, microseconds need 16.)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', string.format('%.0f', now - window))
local logged = redis.call('ZCARD', KEYS[1])
local allowed = logged < limit
if allowed then
    -- Hits in the same microsecond need members of their own.
    local stamp = string.format('%.0f', now)
    local member, suffix = stamp, 0
    while redis.call('ZADD', KEYS[1], 'NX', stamp, member) == 0 do
        suffix = suffix + 1
        member = stamp .. '-' .. suffix
    end
    logged = logged + 1
    redis.call('PEXPIRE', KEYS[1], math.ceil(window / 1000))
end

-- A next hit is allowed once the window holds limit - 1 hits: when the hit at this
-- index (oldest first) leaves it. (More than limit are logged only if limit was lowered.)
local wait = 0
if logged >= limit then
    local leaving = redis.call('ZRANGE', KEYS[1], logged - limit, logged - limit, 'WITHSCORES')
    wait = math.max(0, tonumber(leaving[2]) + window - now)
end
local hits = logged
if not allowed then
    hits = logged + 1
end
return {allowed and 1 or 0, hits, wait}
