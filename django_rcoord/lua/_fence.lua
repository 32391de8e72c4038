-- Fencing tokens (included by the lock scripts that grant a lock).

-- How long a lock's counter outlives its last grant, beyond the lock's own TTL: a name used
-- once leaves no key behind for good. A day, so that an earlier build (whose INCR
-- starts a missing counter from 1) running beside this one in a rolling deploy finds no
-- counter expired.
local FENCE_IDLE_MS = 86400000

-- The next fencing token of the counter `key`, for a grant of `ttl_ms`. A missing counter
-- (a new name, or one idle long enough to expire) starts from the server's clock in
-- microseconds, so tokens still strictly increase across an expiry: a counter gains one per
-- grant, and no server grants once per microsecond. (A server clock set back by more than a
-- counter's idle time could repeat a token; replicas copy the counter, not the clock.)
local function next_fencing_token(key, ttl_ms)
    local token = redis.call('INCR', key)
    if token == 1 then
        local time = redis.call('TIME')
        local seeded = time[1] .. string.format('%06d', tonumber(time[2]))
        redis.call('SET', key, seeded)
        token = tonumber(seeded)
    end
    redis.call('PEXPIRE', key, tonumber(ttl_ms) + FENCE_IDLE_MS)
    return token
end
