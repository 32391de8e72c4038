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

-- The messages of the held ones among `tasks` that end now (acknowledged or made dead
-- letters), by id: their records keep them.
local function ending_messages(group, tasks, held)
    local ending, kept = {}, {}
    for position, task in ipairs(tasks) do
        local outcome = task.outcome
        if held[position] and (outcome == 'ack' or outcome == 'dead') then
            ending[#ending + 1] = task.id
        end
    end
    if #ending > 0 then
        local messages = redis.call('HMGET', group.messages, unpack(ending))
        for position, id in ipairs(ending) do
            kept[id] = messages[position]
        end
    end
    return kept
end

-- Finish the held ones among `tasks` at server time `now` (ms): each acknowledged
-- ('ack'), back in its delayed set ('retry', 'defer', 'later') or a dead letter ('dead'),
-- its record updated (a finished one expires `result_ttl` ms from now). `keep` is how long
-- the group's metrics must live; returns it, longer when a task waits longer than that.
local function finish_held(group, queues, tasks, held, mine, now, result_ttl, lease, keep)
    local states = {}
    if #mine > 0 then
        local loaded = load_states(group.records, group.results, mine)
        for position, id in ipairs(mine) do
            states[id] = loaded[position]
        end
    end
    local kept = ending_messages(group, tasks, held)
    local acked, acked_fields = {}, {}
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
            local fields, ttl = {}, nil
            if outcome == 'ack' then
                state[1], state[4] = 'SUCCESSFUL', stamp
                acked[#acked + 1] = id
                acked_fields[#acked_fields + 1] = id
                acked_fields[#acked_fields + 1] = id .. ':lost'
                fields, ttl = {'v', task.value}, result_ttl
            elseif outcome == 'later' then
                drop_last_delivery(state)
                back_later(task, state)
            else
                if outcome ~= 'defer' then  -- a deferral is not a failed attempt
                    add_error(group.records, id, task.entry)
                    redis.call('HINCRBY', group.failures, id, 1)
                end
                errors[#errors + 1] = id
                errors[#errors + 1] = task.error
                if outcome == 'retry' or outcome == 'defer' then
                    back_later(task, state)
                else
                    state[1], state[4] = 'FAILED', stamp
                    dead[task.queue] = dead[task.queue] or {}
                    table.insert(dead[task.queue], id)
                    fields, ttl = {'x', task.error}, result_ttl
                end
            end
            if kept[id] then
                fields[#fields + 1] = 'm'
                fields[#fields + 1] = kept[id]
            end
            save_state(group.records, id, state, fields, ttl)
        end
    end
    if #acked > 0 then
        -- A finished task's message moves into its record.
        for _, id in ipairs(acked) do
            unique_release(group.results, id, kept[id])
        end
        redis.call('HDEL', group.messages, unpack(acked))
        redis.call('HDEL', group.failures, unpack(acked_fields))
        redis.call('HDEL', group.errors, unpack(acked))
    end
    if #errors > 0 then
        redis.call('HSET', group.errors, unpack(errors))
    end
    for queue_index, members in pairs(delayed) do
        redis.call('ZADD', queues[queue_index].delayed, unpack(members))
    end
    for queue_index, members in pairs(dead) do
        -- A dead letter keeps its message (its record a copy); its claim ends.
        redis.call('RPUSH', queues[queue_index].dead, unpack(members))
        for _, id in ipairs(members) do
            unique_release(group.results, id, kept[id])
        end
    end
    return keep
end
