-- Cancelled tasks (included by task_cancel and task_stopped).
--! include _records
--! include _unique

-- Keep `key` at least `ms` longer.
local function keep_at_least(key, ms)
    if redis.call('PTTL', key) < ms then
        redis.call('PEXPIRE', key, ms)
    end
end

-- Record task `id` as ended for good by a cancel() at server time `now`, with `status`
-- (CANCELLED before it ran; FAILED for a running one stopped on request): its message
-- `message` (nil: gone) moves into its record in `results`, its unique claim ends, its
-- entries in `messages`, `failures` and `errors` go, its record expires `result_ttl` ms
-- from now (`expiry`), and it is counted as cancelled in `metrics` (kept `metrics_ms`)
-- unless `labels` ('queue<US>task') is ''.
local function record_cancelled(messages, failures, errors, results, expiry, metrics, id,
                                message, status, now, result_ttl, labels, metrics_ms)
    local state = load_state(results, id)
    state[1] = status
    state[4] = now
    save_state(results, id, state)
    if message then
        redis.call('HSET', results, id .. ':m', message)
        unique_release(results, id, message)
    end
    redis.call('HDEL', messages, id)
    redis.call('HDEL', failures, id, id .. ':lost')
    redis.call('HDEL', errors, id)
    redis.call('ZADD', expiry, now + result_ttl, id)
    if labels ~= '' then
        redis.call('HINCRBY', metrics, 'c\31' .. labels, 1)
        keep_at_least(metrics, metrics_ms)
    end
    keep_at_least(results, result_ttl)
    keep_at_least(expiry, result_ttl)
end
