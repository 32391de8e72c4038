-- Store a task message and queue it now, or schedule it for later, by the server's clock;
-- a unique task only when no other task holds its claim. The path of a task that is not
-- pushed to the group's incoming LIST (see queues/incoming.py): delayed and unique tasks,
-- and every task while no worker of this release serves the group. One shape; its settings
-- are one record read by name (queues/producer.py task_enqueue_call builds it).
-- KEYS[1]  messages HASH (task id -> message JSON)   KEYS[2] ready ZSET of the queue
-- KEYS[3]  delayed ZSET of the queue (task id -> due time, ms)
-- KEYS[4]  queues HASH of the group (queue name -> its counter)
-- KEYS[5]  incoming LIST of the group (idle workers wait on it: see _ready's wake_workers)
-- KEYS[6]  schedule LIST of the group (wakes delayed-task pollers)   KEYS[7] idle ZSET
-- KEYS[8]  results HASH of the group (it holds the claims of unique tasks, see _unique)
-- KEYS[9]  serving STRING of the group: set while a worker of this release serves it
-- ARGV[1]  the call, JSON: id (the task's), queue (its name within the group), priority
--          (-100..100, higher runs first; a delayed task reads it from its message),
--          delay (ms from now, 0: now), due_at (ms since the epoch on this server's clock,
--          0: use the delay), wake_ms (wake-up tokens' lifetime), keep_ms (how long the
--          group's list of queues outlives its last task); for a unique task, claim (the
--          claim's field, 'u:<sha256>', also in the message as "unique") and claim_ms (how
--          long the claim lasts at most)
-- ARGV[2]  the message JSON
-- Builds   KEYS[2] .. ' key:<fair key>', KEYS[2] .. ' heads', KEYS[2] .. ' waiting',
--          KEYS[2] .. ' running': the lines of the queue's fair keys (see _ready)
-- Returns  {queued, serving}: queued is 1, or 2 when the group's list of queues was created
--          by this call (the producer then records the group in the registry pollers read),
--          or the id of the task holding a unique task's claim (nothing is queued);
--          serving is 1 while KEYS[9] exists (the producer may push the group's plain
--          tasks to KEYS[5])
--! include _enqueue
--! include _unique
local call = cjson.decode(ARGV[1])
local serving = redis.call('EXISTS', KEYS[9])
if call.claim then
    local time = redis.call('TIME')
    local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
    local holder = unique_holder(KEYS[8], KEYS[1], call.claim, now)
    if holder then
        return {holder, serving}
    end
    unique_claim(KEYS[8], call.claim, call.id, now, call.claim_ms)
end
local queued = enqueue_task(KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7],
    call.id, ARGV[2], call.queue, call.delay, call.wake_ms, call.keep_ms, call.due_at,
    call.priority)
return {queued, serving}
