-- Result records (included by the scripts that take, finish and recover tasks). In the
-- group's results HASH, <id> -> 'STATUS|started|last attempted|finished|worker ids' (times
-- in server ms) and <id>:e -> the JSON list of the errors of its failed attempts.

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

local function load_state(results, task_id)
    return parse_state(redis.call('HGET', results, task_id))
end

local function save_state(results, task_id, state)
    redis.call('HSET', results, task_id, table.concat(state, '|'))
end

-- Append the error entry JSON `entry` to the task's list of errors.
local function add_error(results, task_id, entry)
    local field = task_id .. ':e'
    local errors = redis.call('HGET', results, field)
    if errors then
        redis.call('HSET', results, field, string.sub(errors, 1, -2) .. ',' .. entry .. ']')
    else
        redis.call('HSET', results, field, '[' .. entry .. ']')
    end
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
