-- Queue the task of a claimed periodic tick (see periodic_claim), once: the group records,
-- per schedule, the latest tick it queued and when, so a second poller queueing the same
-- pending tick (its claimant died, or its reply was lost) queues nothing. Ticks reach a
-- group in order (a schedule's next tick is claimed only once the pending one is confirmed).
-- KEYS[1]  periodic HASH of the group: <schedule name> -> the latest tick queued here (ms),
--          <schedule name>:at -> when it was queued (ms)
-- KEYS[2]  messages HASH   KEYS[3] ready ZSET of the task's queue   KEYS[4] queues HASH
-- KEYS[5]  incoming LIST of the group (wakes idle workers)   KEYS[6] idle ZSET of the group
-- Builds   KEYS[3] .. ' key:<fair key>', KEYS[3] .. ' heads', KEYS[3] .. ' waiting',
--          KEYS[3] .. ' running': the lines of the queue's fair keys (see _ready)
-- ARGV[1]  schedule name   ARGV[2] tick, ms since the epoch
-- ARGV[3]  task id   ARGV[4] message JSON   ARGV[5] queue name within the group
-- ARGV[6]  priority
-- ARGV[7]  how long the group's list of queues and this HASH outlive their last use, ms
-- A unique task's tick (its message names its claim, see _unique) also has
-- KEYS[7]  results HASH of the group (it holds the claims)
-- ARGV[8]  the claim's field   ARGV[9] how long the claim lasts at most, ms
-- Returns  {status, queued at}: status 1 queued, 2 queued and the group's list of queues was
--          created by this call (the poller records the group again), 0 this tick (or a
--          later one) was queued here already, 3 not queued: a run of the unique task holds
--          its claim (the tick counts as fired: it is not queued later); queued at: when
--          this tick was queued or passed over (ms, this server's clock; 0 when unknown: a
--          later tick is recorded)
--! include _ready
--! include _unique
local name, tick = ARGV[1], tonumber(ARGV[2])
local last, at = unpack(redis.call('HMGET', KEYS[1], name, name .. ':at'))
if tonumber(last or '-1') >= tick then
    return {0, tonumber(last) == tick and tonumber(at or '0') or 0}
end
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
redis.call('HSET', KEYS[1], name, ARGV[2], name .. ':at', now)
redis.call('PEXPIRE', KEYS[1], ARGV[7])
if #KEYS == 7 then
    if unique_holder(KEYS[7], KEYS[2], ARGV[8], now) then
        return {3, now}
    end
    unique_claim(KEYS[7], ARGV[8], ARGV[3], now, tonumber(ARGV[9]))
end
local created = enqueue_now(KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], ARGV[5],
    tonumber(ARGV[7]), ARGV[3], ARGV[4], tonumber(ARGV[6]))
return {created and 2 or 1, now}
