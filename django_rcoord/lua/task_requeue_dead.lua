-- Move every dead letter of a queue back to the end of its priority in the queue, with fresh
-- retries.
-- KEYS[1]  dead LIST   KEYS[2] ready ZSET   KEYS[3] failures HASH   KEYS[4] errors HASH
-- KEYS[5]  wake LIST of the group   KEYS[6] results HASH of the group (requeued: READY again)
-- KEYS[7]  results expiry ZSET (a requeued task's record no longer expires)
-- KEYS[8]  messages HASH (priorities)   KEYS[9] queues HASH of the group (queue counters)
-- ARGV[1]  wake-up token lifetime, ms   ARGV[2] queue name
-- ARGV[3]  how long the group's list of queues outlives its last task, ms
-- Returns  how many tasks were requeued.
--! include _ready
local moved = 0
while true do
    local ids = redis.call('LRANGE', KEYS[1], 0, 999)
    if #ids == 0 then
        break
    end
    for _, id in ipairs(ids) do
        local priority = message_priority(redis.call('HGET', KEYS[8], id))
        ready_add(KEYS[2], KEYS[9], ARGV[2], tonumber(ARGV[3]), id, priority, false)
    end
    redis.call('HDEL', KEYS[3], unpack(ids))
    for _, id in ipairs(ids) do
        redis.call('HDEL', KEYS[3], id .. ':lost')
    end
    redis.call('HDEL', KEYS[4], unpack(ids))
    redis.call('ZREM', KEYS[7], unpack(ids))
    for _, id in ipairs(ids) do
        local state = redis.call('HGET', KEYS[6], id)
        if state then
            redis.call('HSET', KEYS[6], id, (string.gsub(state, '^[^|]*', 'READY', 1)))
        end
    end
    redis.call('LTRIM', KEYS[1], #ids, -1)
    moved = moved + #ids
end
if moved > 0 then
    redis.call('RPUSH', KEYS[5], 1)
    redis.call('PEXPIRE', KEYS[5], ARGV[1])
end
return moved
