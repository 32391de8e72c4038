-- Finish a task this worker holds (acknowledge, retry later, or dead-letter it), and in the
-- same step take the next task, so that a busy worker needs one round trip per task.
-- With an empty task id, only take the next task.
-- KEYS[1]  messages HASH (id -> message JSON)   KEYS[2] owners HASH (id -> worker id)
-- KEYS[3]  failures HASH (id -> failed attempts)   KEYS[4] errors HASH (id -> last error)
-- KEYS[5]  in-flight ZSET of the finished task's queue   KEYS[6] its delayed ZSET
-- KEYS[7]  its dead LIST
-- KEYS[8..] pairs, in priority order, of the queues to take the next task from:
--          ready LIST, in-flight ZSET (none: take nothing)
-- ARGV[1]  task id   ARGV[2] worker id   ARGV[3] outcome: 'ack' | 'retry' | 'dead'
-- ARGV[4]  error text (retry, dead)   ARGV[5] retry delay, ms (retry)   ARGV[6] lease, ms
-- Returns  {finished, next} where finished is 1, or 0 when this worker no longer held the task
--          (its lease ran out and another worker has it: nothing about it is changed), and
--          next is {id, message, queue index, failures} or 0 when no task was taken.
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
local id = ARGV[1]
local finished = 0
if redis.call('HGET', KEYS[2], id) == ARGV[2] and redis.call('ZSCORE', KEYS[5], id) then
    finished = 1
    redis.call('ZREM', KEYS[5], id)
    redis.call('HDEL', KEYS[2], id)
    if ARGV[3] == 'ack' then
        redis.call('HDEL', KEYS[1], id)
        redis.call('HDEL', KEYS[3], id)
        redis.call('HDEL', KEYS[4], id)
    else
        redis.call('HINCRBY', KEYS[3], id, 1)
        redis.call('HSET', KEYS[4], id, ARGV[4])
        if ARGV[3] == 'retry' then
            redis.call('ZADD', KEYS[6], now + tonumber(ARGV[5]), id)
        else
            redis.call('RPUSH', KEYS[7], id)
        end
    end
end

for index = 8, #KEYS, 2 do
    local next_id = redis.call('LPOP', KEYS[index])
    while next_id do
        local message = redis.call('HGET', KEYS[1], next_id)
        if message then
            redis.call('ZADD', KEYS[index + 1], now + tonumber(ARGV[6]), next_id)
            redis.call('HSET', KEYS[2], next_id, ARGV[2])
            local failures = tonumber(redis.call('HGET', KEYS[3], next_id) or '0')
            return {finished, {next_id, message, (index - 6) / 2, failures}}
        end
        -- An id whose message is gone was acknowledged already (a duplicate): skip it.
        next_id = redis.call('LPOP', KEYS[index])
    end
end
return {finished, 0}
