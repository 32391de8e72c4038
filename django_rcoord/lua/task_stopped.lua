-- Finish a run that its worker stopped because cancel() asked (an async task cancelled, or
-- its child process killed): record it FAILED with its error (a TaskCancelled entry),
-- finished, with no retry and no dead letter, as a cancelled queued task is finished: its
-- message moves into its record, its unique claim is dropped, its stop request deleted,
-- and it is counted as cancelled in the group's metrics. Nothing changes unless the worker
-- still holds it (owner and lease).
-- KEYS[1]  messages HASH   KEYS[2] owners HASH   KEYS[3] failures HASH   KEYS[4] errors HASH
-- KEYS[5]  results HASH of the group (the states of running tasks; claims; a previous
--          release's records)
-- KEYS[6]  record prefix of the group (`rcoord:queue:{<group>}:r:`, no key of its own)
-- Builds   KEYS[6] .. <task id>: the task's record HASH (see _records)
-- KEYS[7]  in-flight ZSET of its queue   KEYS[8] the task's stop STRING
-- KEYS[9]  metrics HASH of the group: 'c<US>queue<US>task' -> tasks cancelled (see task_cancel)
-- KEYS[10] ready ZSET of its queue   KEYS[11] queues HASH of the group (queue counters): a
--          run of a fair key with a limit of running tasks ended (see _ready)
-- Builds   KEYS[10] .. ' key:<fair key>', KEYS[10] .. ' heads', KEYS[10] .. ' waiting',
--          KEYS[10] .. ' running': the lines of the queue's fair keys (see _ready)
-- ARGV[1]  the call, JSON (queues/worker/calls.py stopped_call): worker (its id), id (the
--          task's), result_ttl (how long a finished result is kept, ms), entry (the error
--          entry JSON, appended to the record's errors), labels (metric labels
--          'queue<US>task', '': not counted), keep_ms (how long the metrics HASH outlives its
--          last write at least, ms), queue (the queue's name within its group: its
--          counter's field in KEYS[11])
-- Returns  1 when it was finished, 0 when the worker no longer held it (nothing changed)
--! include _ready
--! include _records
--! include _unique
--! include _cancelled
--! include _in_flight
local call = cjson.decode(ARGV[1])
local worker, id = call.worker, call.id
if redis.call('HGET', KEYS[2], id) ~= worker or not redis.call('ZSCORE', KEYS[7], id) then
    return 0
end
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
take_out_of_flight(KEYS[7], KEYS[2], {id})
redis.call('DEL', KEYS[8])
add_error(KEYS[6], id, call.entry)
local message = redis.call('HGET', KEYS[1], id)
local fair_key, fair_limit = message_fair_key(message)
if fair_limit then
    fair_ended(KEYS[10], KEYS[11], call.queue, fair_key)
end
record_cancelled(KEYS[1], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[9], id, message, 'FAILED',
    now, call.result_ttl, call.labels, call.keep_ms)
return 1
