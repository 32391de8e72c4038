-- Taking tasks: task_finish.lua's last step. `group` holds the group's keys by name and
-- `queues[index]` a queue's (ready, in_flight, delayed, dead), in priority order.
--! include _ready
--! include _records
--! include _in_flight

-- The queues of `names` (each queue's name within its group, in the order of `queues`)
-- that the group's SET `paused` holds (pause_queue): {[queue index] = true}. One EXISTS
-- when no queue of the group is paused, the usual case; a member look-up per queue when one is.
local function paused_queues(paused, names)
    local found = {}
    if redis.call('EXISTS', paused) == 1 then
        for index = 1, #names do
            if redis.call('SISMEMBER', paused, names[index]) == 1 then
                found[index] = true
            end
        end
    end
    return found
end

-- Take up to `wanted` tasks for `worker` at server time `now` (ms), highest-priority queue
-- first, none from the queues `skip` holds (paused): each leased for `lease` ms, owned by
-- `worker`, its state (see _records) RUNNING with this delivery; the in-flight ZSET and
-- the owners HASH keep their long member (_in_flight). A queue's tasks taken share each
-- command: their messages, failures and states read by one HMGET each, their leases,
-- owners and states written by one ZADD and two HSETs.
-- Returns the tasks taken ({id, message, queue index, failures, record state} each) and
-- how many were wanted in the end: a task that lost a worker before (id:lost)
-- is taken alone (first, or back for a later call with the tasks after it), so that a task
-- killing its workers does not count against the tasks taken with it. A task taken that
-- heads its fair key's line lets the key's next one in (fair_advance: `names` holds each
-- queue's name within the group, its counter's field in group.queues), behind the tasks
-- ready at its priority; the queue is then popped again while tasks are wanted.
local function take_tasks(group, queues, names, worker, wanted, now, lease, skip)
    local taken = {}
    local stamp = tostring(now)  -- converted once, not per task
    local queue_index, again = 1, false
    while queue_index <= #queues do
        if #taken >= wanted then
            break
        end
        local popped = skip[queue_index] and {}
            or redis.call('ZPOPMIN', queues[queue_index].ready, wanted - #taken)
        again = false
        local ids, scores = {}, {}
        for index = 1, #popped, 2 do
            ids[#ids + 1] = popped[index]
            scores[#scores + 1] = popped[index + 1]
        end
        if #ids > 0 then
            local messages = in_chunks('HMGET', group.messages, ids)
            -- Most tasks never failed: no failures HASH, nothing to read per task.
            local failures = {}
            if redis.call('EXISTS', group.failures) == 1 then
                local fields = {}
                for index = 1, #ids do
                    fields[#fields + 1] = ids[index]
                    fields[#fields + 1] = ids[index] .. ':lost'
                end
                failures = in_chunks('HMGET', group.failures, fields)
            end
            local states = load_states(group.records, group.results, ids)
            local leases, owners, put_back, running, states_taken = {}, {}, {}, {}, {}
            local function put_back_from(first)
                for rest = first, #ids do
                    put_back[#put_back + 1] = scores[rest]
                    put_back[#put_back + 1] = ids[rest]
                end
                wanted = #taken
            end
            for index = 1, #ids do
                local id = ids[index]
                local lost = tonumber(failures[index * 2] or '0') > 0
                if lost and #taken > 0 then
                    -- Taken alone: it goes back, with the tasks after it, for a later call;
                    -- and no lower-priority queue fills the batch ahead of them.
                    put_back_from(index)
                    break
                end
                local fair_key, fair_limit = message_fair_key(messages[index])
                if fair_key or not messages[index] then
                    again = fair_advance(queues[queue_index].ready, group.queues,
                        names[queue_index], fair_key, id, fair_limit) or again
                end
                -- An id whose message is gone was acknowledged already (a duplicate): skip it.
                if messages[index] then
                    leases[#leases + 1] = now + lease
                    leases[#leases + 1] = id
                    owners[#owners + 1] = id
                    owners[#owners + 1] = worker
                    local state = states[index]
                    state[1] = 'RUNNING'
                    if state[2] == '' then
                        state[2] = stamp
                    end
                    state[3] = stamp
                    state[5] = state[5] == '' and worker or state[5] .. ',' .. worker
                    local text = table.concat(state, '|')  -- once: the reply and the HSET
                    running[#running + 1] = id
                    states_taken[#states_taken + 1] = text
                    taken[#taken + 1] = {
                        id, messages[index], queue_index,
                        tonumber(failures[index * 2 - 1] or '0'), text
                    }
                    if lost then
                        put_back_from(index + 1)
                        break
                    end
                end
            end
            if #leases > 0 then
                leases[#leases + 1] = '+inf'
                leases[#leases + 1] = LARGE_ENCODING
                owners[#owners + 1] = LARGE_ENCODING
                owners[#owners + 1] = ''
                in_chunks('ZADD', queues[queue_index].in_flight, leases)
                in_chunks('HSET', group.owners, owners)
                save_live_states(group.results, running, states_taken)
            end
            if #put_back > 0 then
                in_chunks('ZADD', queues[queue_index].ready, put_back)
            end
        end
        if not again then
            queue_index = queue_index + 1
        end
    end
    return taken, wanted
end
