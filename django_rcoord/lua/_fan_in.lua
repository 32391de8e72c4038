-- Fan-ins (django_rcoord.queues.fan_in): count a child's end and queue the callback with
-- the last count. Included by fan_in_child_ended (a child counted by a task of its own:
-- it is in another group than its callback) and by task_finish (a child counted in the
-- step that records its end: it is in its callback's group).
-- Builds   fan_ins .. <fan-in id>: the fan-in's HASH: state (waiting, fired, failed or
--          cancelled), total, ended, failed, message (the callback's, its results' place
--          held by the JSON text in hole), queue, priority, keep_ms, ttl_ms (how
--          long it is kept once it is over), ids (its children's, JSON), and c:<n> for each
--          child n that ended: its place in the callback's results (JSON)
--! include _ready

-- The callback's message with the results of its `total` children, in their order, where
-- `hole` held their place (read 1,000 fields a call: unpack's stack).
local function fan_in_message(fan_in, total, message, hole)
    local results = {}
    for first = 1, total, 1000 do
        local places = {}
        for n = first, math.min(first + 999, total) do
            places[#places + 1] = 'c:' .. n
        end
        for _, value in ipairs(redis.call('HMGET', fan_in, unpack(places))) do
            results[#results + 1] = value
        end
    end
    local at = string.find(message, hole, 1, true)
    return string.sub(message, 1, at - 1) .. '[' .. table.concat(results, ',') .. ']'
        .. string.sub(message, at + #hole)
end

-- Count child `place` of fan-in `id` (its HASH built from `fan_ins`), which left `value`
-- (JSON: its place in the results) and ended `how`: 'ok', 'fail' (it failed and fails
-- the fan-in) or 'failed' (it failed, and the fan-in goes on). The callback is queued with
-- the callback group's `messages`, its queue's `ready`, the group's `queues`, `incoming` and
-- `idle`. Returns 'fired', 'failed' (this child failed the fan-in), 'counted', 'seen'
-- (counted already) or 'gone' (no such fan-in: it expired).
local function fan_in_count(fan_ins, messages, ready, queues, incoming, idle, id, place, value,
                            how)
    local fan_in = fan_ins .. id
    local state = redis.call('HGET', fan_in, 'state')
    if not state then
        return 'gone'
    end
    if redis.call('HSETNX', fan_in, 'c:' .. place, value) == 0 then
        return 'seen'
    end
    local ended = redis.call('HINCRBY', fan_in, 'ended', 1)
    if how ~= 'ok' then
        redis.call('HINCRBY', fan_in, 'failed', 1)
    end
    if state ~= 'waiting' then
        return 'counted'
    end
    local fields = redis.call('HMGET', fan_in, 'total', 'message', 'hole', 'queue', 'priority',
        'keep_ms', 'ttl_ms')
    local total, ttl_ms = tonumber(fields[1]), tonumber(fields[7])
    if how == 'fail' then
        redis.call('HSET', fan_in, 'state', 'failed')
        redis.call('PEXPIRE', fan_in, ttl_ms)
        return 'failed'
    end
    if ended < total then
        return 'counted'
    end
    enqueue_now(messages, ready, queues, incoming, idle, fields[4], tonumber(fields[6]), id,
        fan_in_message(fan_in, total, fields[2], fields[3]), tonumber(fields[5]))
    redis.call('HSET', fan_in, 'state', 'fired')
    redis.call('PEXPIRE', fan_in, ttl_ms)
    return 'fired'
end
