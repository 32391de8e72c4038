-- Give back a semaphore permit, or a place in line, and wake waiters who can now have one.
-- KEYS[1]  holders ZSET   KEYS[2] waiters ZSET   KEYS[3] waiter leases ZSET   KEYS[4] signal LIST
-- ARGV[1]  identifier   ARGV[2] limit   ARGV[3] lifetime of unconsumed wake-up tokens, ms
-- Returns  1 when a held permit was released; 0 when the identifier held none (its lease had
--          ended, or it was only waiting: its place in line is given up).
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
local released = redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('ZREM', KEYS[3], ARGV[1])

local free = tonumber(ARGV[2]) - redis.call('ZCARD', KEYS[1])
local waiting = redis.call('ZCARD', KEYS[2])
-- Unfair semaphores keep no line: one token lets one blocked caller try again.
local wake = math.min(free, math.max(waiting, released))
if wake > 0 then
    redis.call('DEL', KEYS[4])
    for _ = 1, wake do
        redis.call('RPUSH', KEYS[4], 1)
    end
    redis.call('PEXPIRE', KEYS[4], ARGV[3])
end
return released
