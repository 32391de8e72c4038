-- Extend the lease of a task this worker still holds, and the life of the result records.
-- KEYS[1]  owners HASH   KEYS[2] in-flight ZSET of its queue
-- KEYS[3]  results HASH of the group   KEYS[4] results expiry ZSET
-- ARGV[1]  task id   ARGV[2] worker id   ARGV[3] lease, ms, counted from now
-- ARGV[4]  how long the result records must live at least from now, ms
-- ARGV[5]  '1': give the task back (a worker stopping before it ran it): the owner becomes
--          '' so that recovery does not count the lease as a lost delivery
-- Returns  1 when renewed, 0 when the worker no longer holds the task.
if redis.call('HGET', KEYS[1], ARGV[1]) ~= ARGV[2] or not redis.call('ZSCORE', KEYS[2], ARGV[1]) then
    return 0
end
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
redis.call('ZADD', KEYS[2], now + tonumber(ARGV[3]), ARGV[1])
if ARGV[5] == '1' then
    redis.call('HSET', KEYS[1], ARGV[1], '')
end
for index = 3, 4 do
    if redis.call('PTTL', KEYS[index]) < tonumber(ARGV[4]) then
        redis.call('PEXPIRE', KEYS[index], ARGV[4])
    end
end
return 1
