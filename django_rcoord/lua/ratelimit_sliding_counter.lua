-- Count one hit in a sliding window approximated from two fixed windows (of the epoch's
-- clock): the previous window's count, weighted by how much of it the sliding window
-- still covers, plus the current window's count.
-- KEYS[1]  counters HASH (field: a window's number, now // window; value: its allowed hits)
-- ARGV[1]  limit   ARGV[2] window length, us
-- Returns  {1 allowed | 0 refused, estimated hits in the window including this one,
--           us until a next hit would be allowed (0: one would be now)}
-- Only allowed hits are counted. The estimate assumes the previous window's hits were
-- spread evenly over it.
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000000 + tonumber(time[2])
local limit, window = tonumber(ARGV[1]), tonumber(ARGV[2])

local number = math.floor(now / window)
local started = number * window
-- (Fields are formatted by hand: Lua writes numbers with 14 digits, which short windows
-- would exceed.)
local this_window = string.format('%.0f', number)
local last_window = string.format('%.0f', number - 1)
local counts = redis.call('HMGET', KEYS[1], last_window, this_window)
local previous, current = tonumber(counts[1] or 0), tonumber(counts[2] or 0)
local covered = 1 - (now - started) / window  -- share of the previous window still inside

local allowed = previous * covered + current + 1 <= limit
if allowed then
    current = redis.call('HINCRBY', KEYS[1], this_window, 1)
    if current == 1 then
        -- A window's first hit: older windows no longer count, and the counters are kept
        -- until this window is over as the previous one (two windows from its start).
        if redis.call('HLEN', KEYS[1]) > 2 then
            for _, field in ipairs(redis.call('HKEYS', KEYS[1])) do
                if field ~= this_window and field ~= last_window then
                    redis.call('HDEL', KEYS[1], field)
                end
            end
        end
        redis.call('PEXPIRE', KEYS[1], math.ceil(2 * window / 1000))
    end
end

-- The wait until estimate + 1 <= limit: in this window, once enough of the previous one
-- has slid out; or, when this window alone is full, in the next, as this one slides out.
local estimate = previous * covered + current
local wait = 0
if estimate + 1 > limit then
    if current + 1 <= limit then
        wait = started + window * (1 - (limit - 1 - current) / previous) - now
    else
        wait = started + window + window * (1 - (limit - 1) / current) - now
    end
    wait = math.max(0, math.ceil(wait))
end
local hits = math.floor(estimate + 1e-9)
if not allowed then
    hits = math.max(limit + 1, hits + 1)
end
return {allowed and 1 or 0, hits, wait}
