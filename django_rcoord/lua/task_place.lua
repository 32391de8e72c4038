-- Place what the group's incoming LIST holds on the queues (see _incoming), for a reader
-- that must see every queued task: cancel() and get_result() of a task pushed and not placed
-- yet, and the counts of queue_stats().
-- KEYS[1]  incoming LIST of the group   KEYS[2] its ready prefix (no key of its own)
-- Builds   KEYS[2] .. <queue>: the ready ZSET of each queue of the group an entry names
-- KEYS[3]  messages HASH of the group   KEYS[4] queues HASH of the group (queue counters)
-- ARGV[1]  a task id: place entries until its message is stored, or the list is empty; ''
--          to place one batch
-- Returns  the task's message (nil when it is not stored: it is not queued)
--! include _records
--! include _incoming
local id = ARGV[1]
if id == '' then
    place_incoming(KEYS[1], KEYS[2], KEYS[3], KEYS[4], GROUP_KEYS_MS, INCOMING_BATCH)
    return false
end
local message = redis.call('HGET', KEYS[3], id)
while not message and place_incoming(KEYS[1], KEYS[2], KEYS[3], KEYS[4], GROUP_KEYS_MS,
        INCOMING_BATCH) > 0 do
    message = redis.call('HGET', KEYS[3], id)
end
return message
