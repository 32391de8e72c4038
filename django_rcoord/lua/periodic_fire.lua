-- Fire one tick of a periodic task, at most once however many pollers try: claim the tick
-- (it must be due on this server's clock, and later than the schedule's last claimed tick)
-- and queue the task in the same step.
-- KEYS[1]  periodic HASH of the group: <name> -> last claimed tick (ms), <name>:late -> its
--          lateness (ms, claim - tick), <name>:at -> when it was claimed (ms)
-- KEYS[2]  messages HASH   KEYS[3] ready ZSET of the task's queue   KEYS[4] queues HASH
-- KEYS[5]  wake LIST of the group   KEYS[6] idle ZSET of the group
-- KEYS[7]  lateness LIST of this schedule (ms, claim - tick, newest first; fired ticks only)
-- ARGV[1]  schedule name   ARGV[2] tick, ms since the epoch
-- ARGV[3]  'fire': queue the task; 'skip': claim the tick without queueing (a missed tick)
-- ARGV[4]  task id   ARGV[5] message JSON   ARGV[6] queue name   ARGV[7] priority
-- ARGV[8]  wake-up token lifetime, ms   ARGV[9] how long the group's list of queues and
--          this HASH outlive their last use, ms
-- ARGV[10] how many lateness samples to keep
-- Returns  1 fired, 2 skipped, 0 the tick (or a later one) was claimed already, -1 not due
--! include _ready
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
local name, tick = ARGV[1], tonumber(ARGV[2])
if tick > now then
    return -1
end
local last = tonumber(redis.call('HGET', KEYS[1], name) or '-1')
if last >= tick then
    return 0
end
redis.call('HSET', KEYS[1], name, ARGV[2], name .. ':late', now - tick, name .. ':at', now)
redis.call('PEXPIRE', KEYS[1], ARGV[9])
if ARGV[3] ~= 'fire' then
    return 2
end
redis.call('LPUSH', KEYS[7], now - tick)
redis.call('LTRIM', KEYS[7], 0, tonumber(ARGV[10]) - 1)
redis.call('PEXPIRE', KEYS[7], ARGV[9])
enqueue_now(KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], ARGV[6], tonumber(ARGV[9]), ARGV[4],
    ARGV[5], tonumber(ARGV[7]), ARGV[8])
return 1
