-- Confirm that a claimed periodic tick's task is queued (see periodic_claim): forget its
-- pending message, so the schedule's next tick can be claimed, and record the fire's
-- lateness. Only the call that finds the tick pending records it: one sample per fire,
-- however many pollers confirm. A catch-up fire (claimed as 'catch-up': due before its
-- poller started) is counted in the claim's catch_ups instead: its delay is no lateness.
-- KEYS[1]  claim HASH of the schedule (fields as in periodic_claim)
-- KEYS[2]  lateness LIST of the schedule (ms, queued - tick, newest first; on-time fires)
-- ARGV[1]  tick, ms since the epoch
-- ARGV[2]  when it was queued (ms, server clock, as periodic_queue answered; 0: unknown)
-- ARGV[3]  how many lateness samples to keep   ARGV[4] how long the LIST outlives its
--          last sample, ms
-- Returns  1 the tick was pending and is confirmed, 0 it was not pending (confirmed already)
if redis.call('HGET', KEYS[1], 'pending') ~= ARGV[1] then
    return 0
end
redis.call('HDEL', KEYS[1], 'pending', 'queue', 'priority', 'id', 'message')
if redis.call('HGET', KEYS[1], 'kind') == 'catch-up' then
    redis.call('HINCRBY', KEYS[1], 'catch_ups', 1)
elseif tonumber(ARGV[2]) > 0 then
    redis.call('LPUSH', KEYS[2], tonumber(ARGV[2]) - tonumber(ARGV[1]))
    redis.call('LTRIM', KEYS[2], 0, tonumber(ARGV[3]) - 1)
    redis.call('PEXPIRE', KEYS[2], ARGV[4])
end
return 1
