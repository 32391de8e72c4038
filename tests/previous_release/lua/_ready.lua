-- Ready queues (included by the scripts that queue tasks). A queue's ready tasks are a ZSET
-- ordered by priority, then by arrival: score = (100 - priority) * 2^45 + seq, where seq is
-- the queue's own counter (a field of the group's queues HASH). A task put back after its
-- worker's lease ran out goes to the front of its priority: seq - 2^44. Every score is an
-- integer below 2^53, exact in a double.
local READY_BAND = 35184372088832
local READY_FRONT = 17592186044416

-- The priority a task message carries (-100..100; 0 when it names none or is unreadable).
local function message_priority(message)
    if not message or not string.find(message, '"priority"', 1, true) then
        return 0
    end
    local ok, decoded = pcall(cjson.decode, message)
    local priority = ok and type(decoded) == 'table' and tonumber(decoded.priority)
    if not priority or priority < -100 or priority > 100 then
        return 0
    end
    return math.floor(priority)
end

-- The priorities of the tasks `ids` (at least one), read from their messages in `messages`.
local function priorities_of(messages, ids)
    local bodies = redis.call('HMGET', messages, unpack(ids))
    local priorities = {}
    for index = 1, #ids do
        priorities[index] = message_priority(bodies[index])
    end
    return priorities
end

-- Queue the tasks `ids` (at least one, in this order; `priorities` theirs) on the ready ZSET
-- `ready` of queue `queue` (its counter in the HASH `queues`, kept at least `keep_ms`), at
-- the back of their priority, or at the front. One counter step and one ZADD for them all.
-- Returns true when this call created `queues` (the group is new, or was lost).
local function ready_add(ready, queues, queue, keep_ms, ids, priorities, front)
    local count = #ids
    local first = redis.call('HINCRBY', queues, queue, count) - count
    local ttl = redis.call('PTTL', queues)
    if ttl < keep_ms then
        redis.call('PEXPIRE', queues, keep_ms)
    end
    local members = {}
    for index = 1, count do
        local score = (100 - priorities[index]) * READY_BAND + first + index
        if front then
            score = score - READY_FRONT
        end
        members[#members + 1] = string.format('%.0f', score)
        members[#members + 1] = ids[index]
    end
    redis.call('ZADD', ready, unpack(members))
    return ttl == -1
end

-- Store message `body` of task `id` and queue it now on queue `queue` (keys as in
-- ready_add; `messages` the group's HASH of messages), then wake a worker if one is
-- registered idle in the ZSET `idle` (its wake-ups in the LIST `wake`, kept `wake_ms`). A
-- worker leaves `idle` when it takes a task; a registration of a worker that died lingers
-- until another worker registers or the ZSET expires, costing a needless wake-up at most.
-- Returns true when the group's `queues` HASH was created by this call.
local function enqueue_now(messages, ready, queues, wake, idle, queue, keep_ms, id, body,
                           priority, wake_ms)
    redis.call('HSET', messages, id, body)
    local created = ready_add(ready, queues, queue, keep_ms, {id}, {priority}, false)
    if redis.call('EXISTS', idle) == 1 then
        redis.call('RPUSH', wake, 1)
        redis.call('LTRIM', wake, -64, -1)
        redis.call('PEXPIRE', wake, wake_ms)
    end
    return created
end
