-- Result records (included by the scripts that take, finish and recover tasks). Each task's
-- record is a HASH of its own, built from the group's record prefix, a key the caller
-- declares (`rcoord:queue:{<group>}:r:`), so that it shares the group's hash slot:
-- Builds   records .. <task id>: the record HASH of a task. s -> 'STATUS|started|last
--          attempted|finished|worker ids' (times in server ms), v -> its return value JSON,
--          e -> the JSON list of the errors of its failed attempts, m -> the message of a
--          finished task, x -> the last error of a dead letter. A finished record expires
--          its result TTL after it finished; an unfinished one has no expiry (as the group's
--          messages: it ends finished, or goes with a cancel or a dead letter's expiry).
-- A previous release kept a record as fields of the group's results HASH (<id> -> the
-- state, <id>:v, <id>:e, <id>:m): loading a task's state moves those into its record.

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

-- The fields a previous release kept of a record in the results HASH, and their names in
-- the record.
local LEGACY_SUFFIXES = {'', ':v', ':e', ':m'}
local RECORD_FIELDS = {'s', 'v', 'e', 'm'}

-- Move task `id`'s record that a previous release wrote in `results` (its state `raw`) into
-- its own HASH. The legacy state wins: a previous release wrote it after this release's
-- last write (which removes the legacy fields); its errors follow those already recorded.
local function adopt_legacy(records, results, id, raw)
    local key = records .. id
    local legacy = {}
    for index, suffix in ipairs(LEGACY_SUFFIXES) do
        legacy[index] = id .. suffix
    end
    local old = redis.call('HMGET', results, unpack(legacy))
    local fields = {}
    for index = 2, 4 do
        local value = old[index]
        if value and index == 3 then
            local recorded = redis.call('HGET', key, 'e')
            if recorded then
                value = string.sub(recorded, 1, -2) .. ',' .. string.sub(value, 2)
            end
        end
        if value then
            fields[#fields + 1] = RECORD_FIELDS[index]
            fields[#fields + 1] = value
        end
    end
    redis.call('HSET', key, 's', raw, unpack(fields))
    redis.call('HDEL', results, unpack(legacy))
end

-- The states of the records of `ids` (five fields each, see parse_state), in order; one
-- HMGET of `results` finds the records a previous release wrote (see adopt_legacy).
local function load_states(records, results, ids)
    local legacy = redis.call('HMGET', results, unpack(ids))
    local states = {}
    for index, id in ipairs(ids) do
        local raw = legacy[index]
        if raw then
            adopt_legacy(records, results, id, raw)
        else
            local key = records .. id
            raw = redis.call('HGET', key, 's')
        end
        states[index] = parse_state(raw)
    end
    return states
end

local function load_state(records, results, id)
    return load_states(records, results, {id})[1]
end

-- The raw state of task `id`'s record (nil: none), for a task this release wrote last.
local function read_state(records, id)
    local key = records .. id
    return redis.call('HGET', key, 's')
end

-- Write task `id`'s `state` and the further `fields` ({name, value, ...}) into its record;
-- `ttl` (ms, for a finished task): the record expires that long from now.
local function save_state(records, id, state, fields, ttl)
    local key = records .. id
    redis.call('HSET', key, 's', table.concat(state, '|'), unpack(fields or {}))
    if ttl then
        redis.call('PEXPIRE', key, ttl)
    end
end

-- A finished record that is not any more (its dead letter was requeued): no expiry, and no
-- last error of a dead letter.
local function reopen_record(records, id)
    local key = records .. id
    redis.call('PERSIST', key)
    redis.call('HDEL', key, 'x')
end

-- Append the error entry JSON `entry` to the task's list of errors.
local function add_error(records, id, entry)
    local key = records .. id
    local errors = redis.call('HGET', key, 'e')
    if errors then
        redis.call('HSET', key, 'e', string.sub(errors, 1, -2) .. ',' .. entry .. ']')
    else
        redis.call('HSET', key, 'e', '[' .. entry .. ']')
    end
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
