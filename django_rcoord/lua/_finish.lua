-- Finishing the tasks a worker ran: task_finish.lua's first step. `group` holds the group's
-- keys by name and `queues[index]` a queue's (ready, in_flight, delayed, dead); each of
-- `tasks` is one finished task's record (see task_finish.lua).
--! include _records
--! include _unique

-- Which of `tasks` `worker` still holds (owned by it and in its queue's in-flight set):
-- held[position] is true for each, and each leaves both. One that is not held (its lease
-- ran out and another worker has it) is left as it is.
local function take_back_held(group, queues, worker, tasks)
    local ids, by_queue = {}, {}
    for position, task in ipairs(tasks) do
        ids[position] = task.id
        by_queue[task.queue] = by_queue[task.queue] or {}
        table.insert(by_queue[task.queue], position)
    end
    local owners = redis.call('HMGET', group.owners, unpack(ids))
    local held, mine = {}, {}
    for queue_index, positions in pairs(by_queue) do
        local queue_ids = {}
        for _, position in ipairs(positions) do
            queue_ids[#queue_ids + 1] = ids[position]
        end
        local scores = redis.call('ZMSCORE', queues[queue_index].in_flight, unpack(queue_ids))
        local gone = {}
        for at, position in ipairs(positions) do
            if scores[at] and owners[position] == worker then
                held[position] = true
                gone[#gone + 1] = ids[position]
            end
        end
        if #gone > 0 then
            redis.call('ZREM', queues[queue_index].in_flight, unpack(gone))
        end
    end
    for position, id in ipairs(ids) do
        if held[position] then
            mine[#mine + 1] = id
        end
    end
    if #mine > 0 then
        redis.call('HDEL', group.owners, unpack(mine))
    end
    return held, mine
end

-- Finish the held ones among `tasks` at server time `now` (ms): each acknowledged
-- ('ack'), back in its delayed set ('retry', 'defer', 'later') or a dead letter ('dead'),
-- its record updated. `keep` is how long the records' keys must live; returns it, longer
-- when a task waits longer than that.
local function finish_held(group, queues, tasks, held, mine, now, result_ttl, lease, keep)
    local states = {}
    if #mine > 0 then
        local raw_states = redis.call('HMGET', group.results, unpack(mine))
        for position, id in ipairs(mine) do
            states[id] = parse_state(raw_states[position])
        end
    end
    local acked, acked_fields, record_fields, expiring = {}, {}, {}, {}
    local stamp = tostring(now)  -- converted once, not per task
    local errors, delayed, dead = {}, {}, {}
    local function back_later(task, state)
        state[1] = 'READY'
        delayed[task.queue] = delayed[task.queue] or {}
        table.insert(delayed[task.queue], now + task.delay)
        table.insert(delayed[task.queue], task.id)
        keep = math.max(keep, result_ttl + lease + task.delay)
    end
    for position, task in ipairs(tasks) do
        if held[position] then
            local id, outcome, state = task.id, task.outcome, states[task.id]
            if outcome == 'ack' then
                state[1] = 'SUCCESSFUL'
                state[4] = stamp
                acked[#acked + 1] = id
                acked_fields[#acked_fields + 1] = id
                acked_fields[#acked_fields + 1] = id .. ':lost'
                record_fields[#record_fields + 1] = id .. ':v'
                record_fields[#record_fields + 1] = task.value
                expiring[#expiring + 1] = now + result_ttl
                expiring[#expiring + 1] = id
            elseif outcome == 'later' then
                drop_last_delivery(state)
                back_later(task, state)
            else
                if outcome ~= 'defer' then  -- a deferral is not a failed attempt
                    add_error(group.results, id, task.entry)
                    redis.call('HINCRBY', group.failures, id, 1)
                end
                errors[#errors + 1] = id
                errors[#errors + 1] = task.error
                if outcome == 'retry' or outcome == 'defer' then
                    back_later(task, state)
                else
                    state[1] = 'FAILED'
                    state[4] = stamp
                    dead[task.queue] = dead[task.queue] or {}
                    table.insert(dead[task.queue], id)
                    expiring[#expiring + 1] = now + result_ttl
                    expiring[#expiring + 1] = id
                end
            end
            record_fields[#record_fields + 1] = id
            record_fields[#record_fields + 1] = table.concat(state, '|')
        end
    end
    if #acked > 0 then
        -- A finished task's message moves into its record.
        local messages = redis.call('HMGET', group.messages, unpack(acked))
        for position, id in ipairs(acked) do
            unique_release(group.results, id, messages[position])
            if messages[position] then
                record_fields[#record_fields + 1] = id .. ':m'
                record_fields[#record_fields + 1] = messages[position]
            end
        end
        redis.call('HDEL', group.messages, unpack(acked))
        redis.call('HDEL', group.failures, unpack(acked_fields))
        redis.call('HDEL', group.errors, unpack(acked))
    end
    if #record_fields > 0 then
        redis.call('HSET', group.results, unpack(record_fields))
    end
    if #expiring > 0 then
        redis.call('ZADD', group.results_expiry, unpack(expiring))
    end
    if #errors > 0 then
        redis.call('HSET', group.errors, unpack(errors))
    end
    for queue_index, members in pairs(delayed) do
        redis.call('ZADD', queues[queue_index].delayed, unpack(members))
    end
    for queue_index, members in pairs(dead) do
        redis.call('RPUSH', queues[queue_index].dead, unpack(members))
        -- A dead letter keeps its message; its claim ends.
        local messages = redis.call('HMGET', group.messages, unpack(members))
        for position, id in ipairs(members) do
            unique_release(group.results, id, messages[position])
        end
    end
    return keep
end

-- Finished records expire a while later; drop those that have, at most `limit`: more than
-- a call finishes (`finished`), so that under a steady load the sweep outpaces the records
-- made instead of leaving them past their expiry. One HDEL and one ZREM for them all.
local SWEEP_MORE = 16
local SWEEP_MOST = 1500  -- four fields each: within what unpack() takes (about 8,000)
local function drop_expired_records(group, now, finished)
    local limit = math.min(2 * finished + SWEEP_MORE, SWEEP_MOST)
    local expired = redis.call('ZRANGEBYSCORE', group.results_expiry, '-inf', now, 'LIMIT', 0,
        limit)
    if #expired == 0 then
        return
    end
    local fields = {}
    for _, old in ipairs(expired) do
        fields[#fields + 1] = old
        fields[#fields + 1] = old .. ':v'
        fields[#fields + 1] = old .. ':e'
        fields[#fields + 1] = old .. ':m'
    end
    redis.call('HDEL', group.results, unpack(fields))
    redis.call('ZREM', group.results_expiry, unpack(expired))
end
