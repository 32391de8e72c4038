-- Cancel a task that is queued or delayed (a retry waiting for its time included): take it
-- off its queue, record it CANCELLED (finished: its record expires as a finished task's
-- does, its message kept in the record) and drop its unique claim. A task that is running
-- (or taken by a worker's prefetch) is asked to stop: its stop key is set, which its code
-- reads with stop_requested(). A finished task, a dead letter or an unknown one is left
-- alone. A cancellation is counted in the group's metrics HASH, in the same step.
-- KEYS[1]  messages HASH   KEYS[2] ready ZSET of its queue   KEYS[3] delayed ZSET of its queue
-- KEYS[4]  results HASH of the group (the states of queued tasks; claims; a previous
--          release's records)
-- KEYS[5]  record prefix of the group (`rcoord:queue:{<group>}:r:`, no key of its own)
-- Builds   KEYS[5] .. <task id>: the task's record HASH (see _records)
-- KEYS[6]  failures HASH   KEYS[7] errors HASH   KEYS[8] in-flight ZSET of its queue
-- KEYS[9]  the task's stop STRING
-- KEYS[10] metrics HASH of the group: 'c<US>queue<US>task' -> tasks cancelled (see task_finish)
-- KEYS[11] queues HASH of the group (queue counters: a cancelled head of a fair key's line
--          lets the key's next task in, with a fresh one)
-- Builds   KEYS[2] .. ' key:<fair key>', KEYS[2] .. ' heads', KEYS[2] .. ' waiting',
--          KEYS[2] .. ' running': the lines of the queue's fair keys (see _ready)
-- ARGV[1]  the call, JSON (queues/cancel.py): id (the task's), result_ttl (how long a
--          finished result is kept, ms), stop_ms (how long a stop request is kept, ms),
--          labels (metric labels 'queue<US>task', '': not counted), keep_ms (how long the
--          metrics HASH outlives its last write at least, ms), queue (the queue's name
--          within its group: its counter's field in KEYS[11])
-- Returns  1 when it was cancelled, 2 when it is running and was asked to stop, 0 otherwise
--! include _ready
--! include _records
--! include _unique
--! include _cancelled
local call = cjson.decode(ARGV[1])
local id = call.id
local message = redis.call('HGET', KEYS[1], id)
if not message then
    return 0
end
local fair_key = message_fair_key(message)
local queued
if fair_key then
    queued = fair_remove(KEYS[2], KEYS[11], call.queue, fair_key, id)
else
    queued = redis.call('ZREM', KEYS[2], id) == 1
end
if redis.call('ZREM', KEYS[3], id) == 0 and not queued then
    if redis.call('ZSCORE', KEYS[8], id) then
        redis.call('SET', KEYS[9], '1', 'PX', call.stop_ms)
        return 2
    end
    return 0
end
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
record_cancelled(KEYS[1], KEYS[6], KEYS[7], KEYS[4], KEYS[5], KEYS[10], id, message,
    'CANCELLED', now, call.result_ttl, call.labels, call.keep_ms)
return 1
