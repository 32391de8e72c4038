-- Give back a semaphore permit, or a place in line, and wake a waiter who may now have one.
-- KEYS[1]  holders ZSET   KEYS[2] waiters ZSET   KEYS[3] waiter leases ZSET   KEYS[4] signal LIST
-- ARGV[1]  identifier   ARGV[2] lifetime of unconsumed wake-up tokens, ms
-- Returns  1 when a held permit was released; 0 when the identifier held none (its lease had
--          ended, or it was only waiting: its place in line is given up).
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
local released = redis.call('ZREM', KEYS[1], ARGV[1])
-- A holder is not in line (its grant took it out); only a waiter giving up is.
local left_line = 0
if released == 0 then
    left_line = redis.call('ZREM', KEYS[2], ARGV[1])
    redis.call('ZREM', KEYS[3], ARGV[1])
end
-- One token per freed permit, or per place in line given up, while anyone waits. A waiter
-- woken for a permit it may not take yet (someone is ahead of it) passes the token on.
local waiting = redis.call('ZCARD', KEYS[2])
local wake = math.min(released + left_line, waiting)
if wake > 0 then
    for _ = 1, wake do
        redis.call('RPUSH', KEYS[4], 1)
    end
    redis.call('LTRIM', KEYS[4], -waiting, -1)
    redis.call('PEXPIRE', KEYS[4], ARGV[2])
end
return released
