-- Store a task message and queue it now, or schedule it for later, by the server's clock.
-- KEYS[1]  messages HASH (task id -> message JSON)   KEYS[2] ready ZSET of the queue (task ids)
-- KEYS[3]  delayed ZSET of the queue (task id -> due time, ms)
-- KEYS[4]  queues HASH of the group (queue name -> its counter)
-- KEYS[5]  wake LIST of the group (workers)
-- KEYS[6]  schedule LIST of the group (wakes delayed-task pollers)
-- KEYS[7]  idle ZSET of the group (worker id -> until when it waits for a wake-up, ms)
-- ARGV[1]  task id   ARGV[2] message JSON   ARGV[3] queue name   ARGV[4] delay, ms (0: now)
-- ARGV[5]  wake-up token lifetime, ms
-- ARGV[6]  how long the group's list of queues outlives its last task, ms
-- ARGV[7]  due time, ms since the epoch on this server's clock (0: use the delay)
-- ARGV[8]  priority, -100..100 (higher runs first; delayed tasks read it from the message)
-- Returns  1, or 2 when the group's list of queues was created by this call (the producer
--          then records the group in the registry pollers read)
--! include _ready
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
local delay = tonumber(ARGV[4])
if tonumber(ARGV[7]) > 0 then
    delay = tonumber(ARGV[7]) - now
end
local keep = math.max(delay, 0) + tonumber(ARGV[6])
if delay <= 0 then
    local created = enqueue_now(KEYS[1], KEYS[2], KEYS[4], KEYS[5], KEYS[7], ARGV[3], keep,
        ARGV[1], ARGV[2], tonumber(ARGV[8]), now, ARGV[5])
    return created and 2 or 1
end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
redis.call('HINCRBY', KEYS[4], ARGV[3], 0)
local ttl = redis.call('PTTL', KEYS[4])
if ttl < keep then
    redis.call('PEXPIRE', KEYS[4], keep)
end
redis.call('ZADD', KEYS[3], now + delay, ARGV[1])
-- A poller sleeping until a later due time wakes to recompute its sleep.
redis.call('RPUSH', KEYS[6], 1)
redis.call('LTRIM', KEYS[6], -16, -1)
redis.call('PEXPIRE', KEYS[6], ARGV[5])
return ttl == -1 and 2 or 1
