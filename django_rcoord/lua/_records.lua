-- Result records (included by the scripts that take, finish and recover tasks). A task's
-- state ('STATUS|started|last attempted|finished|worker ids', times in server ms) lives in
-- one of two places, so that a batch of tasks is read and written with one command:
--   queued or running (READY, RUNNING): a field of the group's results HASH, <id> -> its
--     state, which one HMGET reads and one HSET writes for a whole batch (the place a
--     previous release kept it too, so both releases read it);
--   finished (SUCCESSFUL, FAILED, CANCELLED): its record HASH, built from the group's record
--     prefix, a key the caller declares (`rcoord:queue:{<group>}:r:`), so that it shares the
--     group's hash slot:
-- Builds   records .. <task id>: the record HASH of a task. s -> its state once finished,
--          v -> its return value JSON, e -> the JSON list of the errors of its failed
--          attempts (from the first failure on), m -> the message of a finished task,
--          x -> the last error of a dead letter. A finished record expires its result TTL
--          after it finished; one holding only the errors of a task still to run has no
--          expiry (as the group's messages: it ends finished, or goes with a cancel).
-- A previous release kept a whole record as fields of the results HASH (<id> -> the state,
-- <id>:v, <id>:e, <id>:m): its state is read where it is, its errors are moved into the
-- task's record when the task is taken again, and its fields go when the task finishes.
--! include _variadic

-- How long a group's keys outlive its last task, ms (queues.keys.GROUP_KEYS_MS).
local GROUP_KEYS_MS = 30 * 24 * 3600 * 1000

-- The five fields of a record's state ('' for each when `raw` is false).
local function parse_state(raw)
    if raw then
        -- One match for a whole state, what the scripts write; the loop below for the rest.
        local status, started, attempted, finished, workers =
            string.match(raw, '^([^|]*)|([^|]*)|([^|]*)|([^|]*)|(.*)$')
        if status then
            return {status, started, attempted, finished, workers}
        end
    end
    local state = {}
    if raw then
        for part in string.gmatch(raw .. '|', '([^|]*)|') do
            state[#state + 1] = part
        end
    end
    for index = #state + 1, 5 do
        state[index] = ''
    end
    return state
end

-- The fields a previous release kept of a record in the results HASH.
local LEGACY_SUFFIXES = {'', ':v', ':e', ':m'}

-- The results HASH lives a while past its last write (half the group keys' time at least:
-- refreshed once in that time, not at every write), also when a unique claim (_unique)
-- gave it a shorter expiry.
local function keep_results(results)
    if redis.call('PTTL', results) < GROUP_KEYS_MS / 2 then
        redis.call('PEXPIRE', results, GROUP_KEYS_MS)
    end
end

-- Append the errors JSON list `errors` (of later attempts) to the task's list of errors.
local function append_errors(records, id, errors)
    local key = records .. id
    local recorded = redis.call('HGET', key, 'e')
    if recorded then
        errors = string.sub(recorded, 1, -2) .. ',' .. string.sub(errors, 2)
    end
    redis.call('HSET', key, 'e', errors)
end

-- The states of the tasks `ids` (five fields each, see parse_state), in order, read with one
-- HMGET of `results` (a new task has none yet); errors a previous release kept there
-- (<id>:e) move into the task's record, after those recorded.
local function load_states(records, results, ids)
    local fields = {}
    for index, id in ipairs(ids) do
        fields[2 * index - 1] = id
        fields[2 * index] = id .. ':e'
    end
    local found = in_chunks('HMGET', results, fields)
    local states = {}
    for index, id in ipairs(ids) do
        if found[2 * index] then
            append_errors(records, id, found[2 * index])
            redis.call('HDEL', results, id .. ':e')
        end
        states[index] = parse_state(found[2 * index - 1])
    end
    return states
end

-- The states of the tasks `ids` that this release took (whose errors are in their records
-- already), in order, with one HMGET of `results`.
local function load_live_states(results, ids)
    local raws = in_chunks('HMGET', results, ids)
    local states = {}
    for index = 1, #ids do
        states[index] = parse_state(raws[index])
    end
    return states
end

local function load_state(records, results, id)
    return load_states(records, results, {id})[1]
end

-- The state of a finished task `id`, wherever it is: a previous release's in `results`
-- (it wrote it last), else its record's.
local function load_finished_state(records, results, id)
    local state = load_state(records, results, id)
    if state[1] == '' then
        local key = records .. id
        state = parse_state(redis.call('HGET', key, 's'))
    end
    return state
end

-- Write the states of the queued or running tasks `ids` (`states`, in order: each five
-- fields, or its text as table.concat(state, '|') makes it) into `results`, one HSET for
-- them all.
local function save_live_states(results, ids, states)
    local fields = {}
    for index, id in ipairs(ids) do
        local state = states[index]
        fields[2 * index - 1] = id
        fields[2 * index] = type(state) == 'table' and table.concat(state, '|') or state
    end
    in_chunks('HSET', results, fields)
    keep_results(results)
end

-- Write finished task `id`'s `state` and the further `fields` ({name, value, ...}) into its
-- record, which expires `ttl` ms from now. Its fields in `results` are the caller's to drop
-- (one HDEL for a batch).
local function save_finished_state(records, id, state, fields, ttl)
    local key = records .. id
    redis.call('HSET', key, 's', table.concat(state, '|'), unpack(fields))
    redis.call('PEXPIRE', key, ttl)
end

-- Write task `id`'s `state`: finished when `ttl` (ms) is given (into its record, with the
-- further `fields`, and out of `results`, a previous release's fields too), else queued or
-- running (into `results`).
local function save_state(records, results, id, state, fields, ttl)
    if ttl then
        save_finished_state(records, id, state, fields or {}, ttl)
        local legacy = {}
        for index, suffix in ipairs(LEGACY_SUFFIXES) do
            legacy[index] = id .. suffix
        end
        redis.call('HDEL', results, unpack(legacy))
    else
        save_live_states(results, {id}, {state})
    end
end

-- A finished record that is not any more (its dead letter was requeued: its state goes back
-- to `results`): no state, message or last error of a dead letter, and no expiry (its
-- errors stay).
local function reopen_record(records, id)
    local key = records .. id
    redis.call('HDEL', key, 's', 'm', 'x')
    redis.call('PERSIST', key)
end

-- Append the error entry JSON `entry` to the task's list of errors.
local function add_error(records, id, entry)
    append_errors(records, id, '[' .. entry .. ']')
end

-- Drop at most `limit` of the records a previous release wrote in `results` whose time in
-- its expiry ZSET `expiry` passed by `now` (ms): that release's workers swept them as they
-- finished tasks; once they are gone, this does (nothing to do, one read, when none is left).
local function drop_expired_legacy(results, expiry, now, limit)
    local expired = redis.call('ZRANGEBYSCORE', expiry, '-inf', now, 'LIMIT', 0, limit)
    if #expired == 0 then
        return
    end
    local fields = {}
    for _, id in ipairs(expired) do
        for _, suffix in ipairs(LEGACY_SUFFIXES) do
            fields[#fields + 1] = id .. suffix
        end
    end
    redis.call('HDEL', results, unpack(fields))
    redis.call('ZREM', expiry, unpack(expired))
end

-- Undo a delivery that did not run (given back, or held back by its task's limits): drop
-- its worker id, the last of `state`'s, and when it was the only one, the start and the
-- last attempt too (with earlier runs, the last attempt stays this delivery's time).
local function drop_last_delivery(state)
    state[5] = string.match(state[5], '^(.*),[^,]*$') or ''
    if state[5] == '' then
        state[2], state[3] = '', ''
    end
end
