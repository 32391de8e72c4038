-- Take the next task from the first non-empty queue (priority order), leasing it to a worker.
-- KEYS[1]  messages HASH   KEYS[2] owners HASH (task id -> worker id)
-- KEYS[3]  failures HASH (task id -> failed attempts so far)
-- KEYS[4..] pairs, in priority order: ready LIST of a queue, then its in-flight ZSET
--          (task id -> lease end, ms)
-- ARGV[1]  worker id   ARGV[2] lease, ms
-- Returns  {id, message JSON, queue index (1-based), failed attempts so far} or 0 when every
--          queue is empty.
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
for index = 4, #KEYS, 2 do
    local id = redis.call('LPOP', KEYS[index])
    while id do
        local message = redis.call('HGET', KEYS[1], id)
        if message then
            redis.call('ZADD', KEYS[index + 1], now + tonumber(ARGV[2]), id)
            redis.call('HSET', KEYS[2], id, ARGV[1])
            local failures = tonumber(redis.call('HGET', KEYS[3], id) or '0')
            return {id, message, (index - 2) / 2, failures}
        end
        -- An id whose message is gone was acknowledged already (a duplicate): skip it.
        id = redis.call('LPOP', KEYS[index])
    end
end
return 0
