-- Count one hit by the generic cell rate algorithm (a token bucket kept as one time).
-- KEYS[1]  theoretical arrival time STRING (us of server time; expires when it has passed)
-- ARGV[1]  limit   ARGV[2] window length, us
-- Returns  {1 allowed | 0 refused, cells in use including this one,
--           us until a next hit would be allowed (0: one would be now)}
-- Hits are spaced window / limit apart (the emission interval); up to limit of them may
-- come at once after a quiet window. The stored time is when every cell would be free
-- again (the bucket full); a hit is allowed when that time, pushed one interval on, is at
-- most one window ahead. A refused hit changes nothing.
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000000 + tonumber(time[2])
local limit, window = tonumber(ARGV[1]), tonumber(ARGV[2])
local interval = window / limit

local tat = tonumber(redis.call('GET', KEYS[1]) or 0)
if tat < now then
    tat = now
end
local next_tat = tat + interval
local allowed = next_tat - now <= window
-- Cells in use: the time ahead of now, in intervals (this hit's cell included).
local hits = math.ceil((next_tat - now) / interval - 1e-9)
if allowed then
    tat = next_tat
    hits = math.min(hits, limit)
    redis.call('SET', KEYS[1], string.format('%.0f', tat), 'PX', math.ceil((tat - now) / 1000))
else
    hits = math.max(hits, limit + 1)
end
local wait = math.max(0, math.ceil(tat + interval - window - now))
return {allowed and 1 or 0, hits, wait}
