-- Claim one tick of a periodic task, at most once however many pollers try, whatever queue
-- group each of them maps the task to: the claim lives in the schedule's own hash slot. The
-- tick must be due on this server's clock and later than the schedule's last claimed tick.
-- A tick claimed to fire keeps its task's message and queue here ("pending") until a poller
-- has queued it (periodic_queue) and confirmed it (periodic_confirm): a poller that dies in
-- between leaves it for the next one, which queues that same message in that same queue.
-- KEYS[1]  claim HASH of the schedule: tick -> last claimed tick (ms), late -> its lateness
--          (ms, claim - tick), at -> when it was claimed (ms), kind -> how (ARGV[2]),
--          catch_ups -> how many catch-up fires were confirmed (periodic_confirm); while a
--          fired tick is not confirmed queued: pending -> that tick, queue, priority, id,
--          message -> its task
-- ARGV[1]  tick, ms since the epoch
-- ARGV[2]  'fire': claim the tick to queue its task; 'catch-up': the same, for a tick due
--          before the poller started (or a missed one run by catch_up "once"), whose delay
--          is no lateness; 'skip': claim it without (a missed tick)
-- ARGV[3]  queue name (as given, e.g. 'reports/pdf')   ARGV[4] priority
-- ARGV[5]  task id   ARGV[6] message JSON
-- ARGV[7]  how long the claim outlives its last use, ms
-- Returns  1 claimed to fire (pending), 2 claimed and skipped, 0 the tick (or a later one)
--          was claimed already, -1 not due yet, 3 an earlier claimed tick is still pending
--          (queue it first: a group's record of the ticks it holds only moves forward)
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
local tick = tonumber(ARGV[1])
if tick > now then
    return -1
end
local last, pending = unpack(redis.call('HMGET', KEYS[1], 'tick', 'pending'))
if tonumber(last or '-1') >= tick then
    return 0
end
if pending then
    return 3
end
redis.call('HSET', KEYS[1], 'tick', ARGV[1], 'late', now - tick, 'at', now, 'kind', ARGV[2])
if ARGV[2] ~= 'skip' then
    redis.call('HSET', KEYS[1], 'pending', ARGV[1], 'queue', ARGV[3], 'priority', ARGV[4],
        'id', ARGV[5], 'message', ARGV[6])
end
redis.call('PEXPIRE', KEYS[1], ARGV[7])
return ARGV[2] ~= 'skip' and 1 or 2
