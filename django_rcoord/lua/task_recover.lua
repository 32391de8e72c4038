-- Put back tasks whose lease ran out (their worker died) at the front of their priority in
-- their queue, and move delayed tasks that are due to the back of theirs, recording how late
-- each was moved. A task whose worker died (or lost Redis) while running it `max lost` times
-- is a dead letter instead: it is probably what kills its workers. By the server's clock; run
-- by workers when idle and by the delayed-task poller.
-- KEYS[1]  owners HASH   KEYS[2] ready ZSET   KEYS[3] in-flight ZSET   KEYS[4] delayed ZSET
-- KEYS[5]  incoming LIST of the group (idle workers wait on it: see _ready's wake_workers)   KEYS[6] lateness LIST of the group (ms, newest first)
-- KEYS[7]  results HASH of the group (a task put back is READY again: its state, see
--          _records)
-- KEYS[8]  messages HASH (priorities)   KEYS[9] queues HASH of the group (queue counters)
-- KEYS[10] failures HASH (id -> failed attempts; id:lost -> deliveries whose worker died)
-- KEYS[11] errors HASH (id -> last error)   KEYS[12] dead LIST of the queue
-- KEYS[13] record prefix of the group (`rcoord:queue:{<group>}:r:`, no key of its own)
-- Builds   KEYS[13] .. <task id>: each task's record HASH (see _records; KEYS[7] holds
--          the records a previous release wrote)
-- KEYS[14] results expiry ZSET of a previous release (its records' expiry: those past it
--          are dropped, at most `most tasks to move` a call)
-- Builds   KEYS[2] .. ' key:<fair key>', KEYS[2] .. ' heads', KEYS[2] .. ' waiting',
--          KEYS[2] .. ' running': the lines of the queue's fair keys (see _ready)
-- ARGV[1]  the call, JSON (queues/records.py recover_and_promote): batch (most tasks to
--          move per kind), samples (how many lateness samples to keep), keep_ms (lifetime
--          of the lateness samples and of the group's list of queues, ms), queue (the
--          queue's name within its group), max_lost (most deliveries whose worker died
--          before a task is a dead letter), result_ttl (how long a finished result is
--          kept, ms)
-- A unique task made a dead letter drops its claim (see _unique).
-- Returns  {tasks recovered, tasks promoted, ms until the next delayed task is due (-1: none),
--          tasks made dead letters}
--! include _ready
--! include _records
--! include _unique
--! include _in_flight
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
local call = cjson.decode(ARGV[1])
local batch = call.batch
local expired = redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', now, 'LIMIT', 0, batch)
local keep = call.keep_ms
local max_lost, result_ttl = call.max_lost, call.result_ttl
local killed = 0
drop_expired_legacy(KEYS[7], KEYS[14], now, batch)
local put_back = {}
for _, id in ipairs(expired) do
    -- A task given back by a stopping worker (owner '') was not lost.
    local lost = 0
    if redis.call('HGET', KEYS[1], id) ~= '' then
        lost = redis.call('HINCRBY', KEYS[10], id .. ':lost', 1)
    end
    local state = load_state(KEYS[13], KEYS[7], id)
    if lost >= max_lost then
        killed = killed + 1
        local reason = 'its worker died (or lost Redis) while running it, ' .. lost
            .. ' times (RCOORD["TASK_MAX_DELIVERIES"] = ' .. max_lost .. ')'
        redis.call('HINCRBY', KEYS[10], id, 1)
        redis.call('HSET', KEYS[11], id, reason)
        redis.call('RPUSH', KEYS[12], id)
        local message = redis.call('HGET', KEYS[8], id)
        unique_release(KEYS[7], id, message)
        local fair_key, fair_limit = message_fair_key(message)
        if fair_limit then
            fair_ended(KEYS[2], KEYS[9], call.queue, fair_key)
        end
        local entry = cjson.encode({
            exception_class_path = 'django_rcoord.exceptions.WorkerLost', traceback = reason
        })
        add_error(KEYS[13], id, entry)
        state[1], state[4] = 'FAILED', now
        local fields = {'x', reason}
        if message then
            fields[3], fields[4] = 'm', message
        end
        save_state(KEYS[13], KEYS[7], id, state, fields, result_ttl)
    else
        put_back[#put_back + 1] = id
        if state[1] ~= '' then
            state[1] = 'READY'
            save_state(KEYS[13], KEYS[7], id, state)
        end
    end
end
if #put_back > 0 then
    local priorities, fair_keys, fair_limits = priorities_of(KEYS[8], put_back)
    ready_add(KEYS[2], KEYS[9], call.queue, keep, put_back, priorities, true, fair_keys)
    fair_runs_ended(KEYS[2], KEYS[9], call.queue, fair_keys, fair_limits)
end
if #expired > 0 then
    take_out_of_flight(KEYS[3], KEYS[1], expired)
end
local due = redis.call('ZRANGEBYSCORE', KEYS[4], '-inf', now, 'WITHSCORES', 'LIMIT', 0, batch)
local promoted = #due / 2
if promoted > 0 then
    local ids, lateness = {}, {}
    for i = 1, #due, 2 do
        ids[#ids + 1] = due[i]
        lateness[#lateness + 1] = now - tonumber(due[i + 1])
    end
    redis.call('ZREM', KEYS[4], unpack(ids))
    local priorities, fair_keys = priorities_of(KEYS[8], ids)
    ready_add(KEYS[2], KEYS[9], call.queue, keep, ids, priorities, false, fair_keys)
    redis.call('LPUSH', KEYS[6], unpack(lateness))
    redis.call('LTRIM', KEYS[6], 0, call.samples - 1)
    redis.call('PEXPIRE', KEYS[6], keep)
end
local moved = #expired - killed + promoted
if moved > 0 then
    wake_workers(KEYS[5])
end
local next_due = redis.call('ZRANGE', KEYS[4], 0, 0, 'WITHSCORES')
if #next_due == 0 then
    return {#expired - killed, promoted, -1, killed}
end
return {#expired - killed, promoted, tonumber(next_due[2]) - now, killed}
