-- The group's incoming LIST (included by the scripts that take, cancel and count tasks):
-- a producer queues a plain task now with one RPUSH of an entry there, and the next script
-- that takes (or must see every queued task) places the entries on their queues, in the
-- order they were pushed. An entry: '<priority> <queue> <id length> <id><message JSON>',
-- the queue's name within its group as its keys spell it (encoded: no space, no '%' but
-- its escapes). Idle workers wait on the list (a BLMOVE of it onto itself, which takes
-- nothing): an entry, or a token ('', see _ready's wake_workers), wakes them.
-- Builds   readies .. <queue>: the ready ZSET of each queue an entry names (`readies`: the
--          group's ready prefix, `rcoord:queue:{<group>}:ready:`, as the caller gives it)
--! include _ready
--! include _variadic

-- Most entries one call places: a take places what it finds before it takes (so that a
-- task pushed with a higher priority is taken first), within a bounded time a call.
local INCOMING_BATCH = 1000

-- The queue's name within its group, from its key's spelling (keys.encode_name).
local function decoded_name(encoded)
    if not string.find(encoded, '%', 1, true) then
        return encoded
    end
    return (string.gsub(encoded, '%%(%x%x)', function(hex)
        return string.char(tonumber(hex, 16))
    end))
end

-- Place at most `limit` entries of `incoming` on their queues: their messages into the
-- group's `messages` HASH (one HSET), each queue's tasks on its ready ZSET (`readies` ..
-- the queue, ready_add: one counter step and one ZADD a queue, fair keys lined up), the
-- group's `queues` HASH kept `keep_ms` at least. Tokens and unreadable entries are dropped.
-- Returns how many entries it took (0: the list is empty).
local function place_incoming(incoming, readies, messages, queues, keep_ms, limit)
    local entries = redis.call('LPOP', incoming, limit)
    if not entries then
        return 0
    end
    local bodies, by_queue, order = {}, {}, {}
    for _, entry in ipairs(entries) do
        local priority, queue, length, at = string.match(entry, '^(%-?%d+) (%S+) (%d+) ()')
        priority = tonumber(priority)
        if priority and priority >= -100 and priority <= 100 then
            local id = string.sub(entry, at, at + length - 1)
            local body = string.sub(entry, at + length)
            local placed = by_queue[queue]
            if not placed then
                placed = {ids = {}, priorities = {}, fair_keys = {}}
                by_queue[queue] = placed
                order[#order + 1] = queue
            end
            local index = #placed.ids + 1
            placed.ids[index] = id
            placed.priorities[index] = priority
            placed.fair_keys[index] = message_fair_key(body)
            bodies[#bodies + 1] = id
            bodies[#bodies + 1] = body
        end
    end
    if #bodies == 0 then
        return #entries
    end
    in_chunks('HSET', messages, bodies)
    for _, queue in ipairs(order) do
        local placed = by_queue[queue]
        ready_add(readies .. queue, queues, decoded_name(queue), keep_ms, placed.ids,
            placed.priorities, false, placed.fair_keys)
    end
    return #entries
end
