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
    local owners = in_chunks('HMGET', group.owners, ids)
    local held, mine = {}, {}
    for queue_index, positions in pairs(by_queue) do
        local queue_ids = {}
        for _, position in ipairs(positions) do
            queue_ids[#queue_ids + 1] = ids[position]
        end
        local scores = in_chunks('ZMSCORE', queues[queue_index].in_flight, queue_ids)
        local gone = {}
        for at, position in ipairs(positions) do
            if scores[at] and owners[position] == worker then
                held[position] = true
                gone[#gone + 1] = ids[position]
            end
        end
        if #gone > 0 then
            in_chunks('ZREM', queues[queue_index].in_flight, gone)
        end
    end
    for position, id in ipairs(ids) do
        if held[position] then
            mine[#mine + 1] = id
        end
    end
    if #mine > 0 then
        in_chunks('HDEL', group.owners, mine)
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
        local messages = in_chunks('HMGET', group.messages, ending)
        for position, id in ipairs(ending) do
            kept[id] = messages[position]
        end
    end
    return kept
end

-- Finish the held ones among `tasks` at server time `now` (ms): each acknowledged
-- ('ack'), back in its delayed set ('retry', 'defer', 'later') or a dead letter ('dead'),
-- its state updated: a finished one's into its record, which expires `result_ttl` ms from
-- now, one going back into the results HASH (one HSET for them all). `keep` is how long
-- the group's metrics must live; returns it, longer when a task waits longer than that.
local function finish_held(group, queues, tasks, held, mine, now, result_ttl, lease, keep)
    local states = {}
    if #mine > 0 then
        local loaded = load_live_states(group.results, mine)  -- this release took them
        for position, id in ipairs(mine) do
            states[id] = loaded[position]
        end
    end
    local kept = ending_messages(group, tasks, held)
    local acked, ended = {}, {}
    local stamp = tostring(now)  -- converted once, not per task
    local errors, delayed, dead, waiting, waiting_states = {}, {}, {}, {}, {}
    local function back_later(task, state)
        state[1] = 'READY'
        delayed[task.queue] = delayed[task.queue] or {}
        table.insert(delayed[task.queue], now + task.delay)
        table.insert(delayed[task.queue], task.id)
        waiting[#waiting + 1] = task.id
        waiting_states[#waiting_states + 1] = state
        keep = math.max(keep, result_ttl + lease + task.delay)
    end
    for position, task in ipairs(tasks) do
        if held[position] then
            local id, outcome, state = task.id, task.outcome, states[task.id]
            local fields = nil
            if outcome == 'ack' then
                state[1], state[4] = 'SUCCESSFUL', stamp
                acked[#acked + 1] = id
                fields = {'v', task.value}
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
                    fields = {'x', task.error}
                end
            end
            if fields then
                if kept[id] then
                    fields[3], fields[4] = 'm', kept[id]
                end
                save_finished_state(group.records, id, state, fields, result_ttl)
                ended[#ended + 1] = id
            end
        end
    end
    if #ended > 0 then
        -- Their states are in their records now.
        in_chunks('HDEL', group.results, ended)
    end
    if #waiting > 0 then
        save_live_states(group.results, waiting, waiting_states)
    end
    if #ended > 0 then
        -- Acknowledged or dead letters, their claims end.
        unique_release_all(group.results, ended, kept)
    end
    if #acked > 0 then
        -- A finished task's message moves into its record.
        in_chunks('HDEL', group.messages, acked)
        -- Most tasks never failed: neither HASH holds anything of theirs, or exists.
        if redis.call('EXISTS', group.failures) == 1 then
            local fields = {}
            for _, id in ipairs(acked) do
                fields[#fields + 1] = id
                fields[#fields + 1] = id .. ':lost'
            end
            in_chunks('HDEL', group.failures, fields)
        end
        if redis.call('EXISTS', group.errors) == 1 then
            in_chunks('HDEL', group.errors, acked)
        end
    end
    if #errors > 0 then
        in_chunks('HSET', group.errors, errors)
    end
    for queue_index, members in pairs(delayed) do
        in_chunks('ZADD', queues[queue_index].delayed, members)
    end
    for queue_index, members in pairs(dead) do
        -- A dead letter keeps its message (its record a copy); its claim ends.
        in_chunks('RPUSH', queues[queue_index].dead, members)
    end
    return keep
end
