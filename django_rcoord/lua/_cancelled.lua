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
-- `message` (nil: gone) moves into its record (see _records: `records`, the record prefix;
-- `results`, the states, claims and a previous release's records), its unique claim ends, its
-- entries in `messages`, `failures` and `errors` go, its record expires `result_ttl` ms
-- from now, and it is counted as cancelled in `metrics` (kept `metrics_ms`) unless `labels`
-- ('queue<US>task') is ''.
local function record_cancelled(messages, failures, errors, results, records, metrics, id,
                                message, status, now, result_ttl, labels, metrics_ms)
    local state = load_state(records, results, id)
    state[1] = status
    state[4] = now
    save_state(records, results, id, state, message and {'m', message} or {}, result_ttl)
    if message then
        unique_release(results, id, message)
    end
    redis.call('HDEL', messages, id)
    redis.call('HDEL', failures, id, id .. ':lost')
    redis.call('HDEL', errors, id)
    if labels ~= '' then
        redis.call('HINCRBY', metrics, 'c\31' .. labels, 1)
        keep_at_least(metrics, metrics_ms)
    end
end
