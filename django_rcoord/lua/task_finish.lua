-- Finish a task this worker holds (acknowledge, retry later, or dead-letter it), and in the
-- same step take the next task, so that a busy worker needs one round trip per task. Both
-- steps keep the tasks' result records (status, times, worker ids, errors, return value).
-- With an empty task id, only take the next task.
-- KEYS[1]  messages HASH (id -> message JSON)   KEYS[2] owners HASH (id -> worker id)
-- KEYS[3]  failures HASH (id -> failed attempts; id:lost -> deliveries whose worker died)
-- KEYS[4]  errors HASH (id -> last error)
-- KEYS[5]  in-flight ZSET of the finished task's queue   KEYS[6] its delayed ZSET
-- KEYS[7]  its dead LIST
-- KEYS[8]  results HASH of the group: <id> -> 'STATUS|started|last attempted|finished|workers'
--          (times in server ms, worker ids comma-separated), <id>:v -> return value JSON,
--          <id>:e -> errors JSON list, <id>:m -> the message of a finished task
-- KEYS[9]  results expiry ZSET (id -> when its finished record expires, ms)
-- KEYS[10] idle ZSET of the group (worker id -> until when it waits for a wake-up, ms)
-- KEYS[11] metrics HASH of the group: 'n<US>queue<US>task<US>outcome<US>bucket' -> runs that
--          ended so, by duration bucket; 's<US>queue<US>task<US>outcome' -> their run time, us;
--          'm<US>queue<US>minute % 60' -> 'minute:finished' (the last hour, per minute)
--          (<US> is the byte 0x1f)
-- KEYS[12..] pairs, in priority order, of the queues to take the next task from:
--          ready ZSET (highest priority first), in-flight ZSET (none: take nothing)
-- ARGV[1]  task id   ARGV[2] worker id   ARGV[3] outcome: 'ack' | 'retry' | 'dead'
-- ARGV[4]  error text (retry, dead)   ARGV[5] retry delay, ms (retry)   ARGV[6] lease, ms
-- ARGV[7]  return value JSON (ack)   ARGV[8] error entry JSON (retry, dead)
-- ARGV[9]  how long a finished result is kept, ms
-- ARGV[10] ms this worker waits for a wake-up when it finds nothing (it is registered idle
--          for that long, so that producers wake it; 0: do not register)
-- ARGV[11] '1' when this worker is registered idle (taking a task unregisters it)
-- ARGV[12] metric labels of the finished task: 'queue<US>task' ('' to count nothing)
-- ARGV[13] its run time's bucket (index in the worker's duration buckets)
-- ARGV[14] its run time, us
-- Returns  {finished, next} where finished is 1, or 0 when this worker no longer held the task
--          (its lease ran out and another worker has it: nothing about it is changed), and
--          next is {id, message, queue index, failures, record state} or 0 when no task was
--          taken.
--! include _records
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
local id = ARGV[1]
local finished = 0
local result_ttl = tonumber(ARGV[9])
-- The records' keys live as long as the longest-lived record needs (running tasks renew it).
local keep = result_ttl + tonumber(ARGV[6])

if redis.call('HGET', KEYS[2], id) == ARGV[2] and redis.call('ZSCORE', KEYS[5], id) then
    finished = 1
    redis.call('ZREM', KEYS[5], id)
    redis.call('HDEL', KEYS[2], id)
    local state = load_state(KEYS[8], id)
    if ARGV[3] == 'ack' then
        state[1] = 'SUCCESSFUL'
        state[4] = now
        redis.call('HSET', KEYS[8], id .. ':v', ARGV[7])
        local message = redis.call('HGET', KEYS[1], id)
        if message then
            redis.call('HSET', KEYS[8], id .. ':m', message)
        end
        redis.call('HDEL', KEYS[1], id)
        redis.call('HDEL', KEYS[3], id, id .. ':lost')
        redis.call('HDEL', KEYS[4], id)
        redis.call('ZADD', KEYS[9], now + result_ttl, id)
    else
        add_error(KEYS[8], id, ARGV[8])
        redis.call('HINCRBY', KEYS[3], id, 1)
        redis.call('HSET', KEYS[4], id, ARGV[4])
        if ARGV[3] == 'retry' then
            state[1] = 'READY'
            redis.call('ZADD', KEYS[6], now + tonumber(ARGV[5]), id)
            keep = keep + tonumber(ARGV[5])
        else
            state[1] = 'FAILED'
            state[4] = now
            redis.call('RPUSH', KEYS[7], id)
            redis.call('ZADD', KEYS[9], now + result_ttl, id)
        end
    end
    save_state(KEYS[8], id, state)
    -- Finished records expire a while later; drop a few that have.
    local expired = redis.call('ZRANGEBYSCORE', KEYS[9], '-inf', now, 'LIMIT', 0, 16)
    for _, old in ipairs(expired) do
        redis.call('HDEL', KEYS[8], old, old .. ':v', old .. ':e', old .. ':m')
    end
    if #expired > 0 then
        redis.call('ZREM', KEYS[9], unpack(expired))
    end
    if ARGV[12] ~= '' then
        local US = '\31'
        local labels = ARGV[12] .. US .. ARGV[3]
        redis.call('HINCRBY', KEYS[11], 'n' .. US .. labels .. US .. ARGV[13], 1)
        redis.call('HINCRBY', KEYS[11], 's' .. US .. labels, ARGV[14])
        -- Finished per minute: a ring of 60 fields per queue, each 'minute:count'.
        local minute = math.floor(now / 60000)
        local queue = string.match(ARGV[12], '^[^\31]*')
        local slot = 'm' .. US .. queue .. US .. (minute % 60)
        local seen = redis.call('HGET', KEYS[11], slot)
        local at, count = string.match(seen or '', '^(%d+):(%d+)$')
        if tonumber(at) == minute then
            redis.call('HSET', KEYS[11], slot, minute .. ':' .. (tonumber(count) + 1))
        else
            redis.call('HSET', KEYS[11], slot, minute .. ':1')
            redis.call('PEXPIRE', KEYS[11], keep + 30 * 24 * 3600 * 1000)
        end
    end
end

local taken = 0
for index = 12, #KEYS, 2 do
    local popped = redis.call('ZPOPMIN', KEYS[index])
    while popped[1] do
        local next_id = popped[1]
        local message = redis.call('HGET', KEYS[1], next_id)
        if message then
            redis.call('ZADD', KEYS[index + 1], now + tonumber(ARGV[6]), next_id)
            redis.call('HSET', KEYS[2], next_id, ARGV[2])
            local failures = tonumber(redis.call('HGET', KEYS[3], next_id) or '0')
            local state = load_state(KEYS[8], next_id)
            state[1] = 'RUNNING'
            if state[2] == '' then
                state[2] = now
            end
            state[3] = now
            state[5] = state[5] == '' and ARGV[2] or state[5] .. ',' .. ARGV[2]
            save_state(KEYS[8], next_id, state)
            taken = {next_id, message, (index - 10) / 2, failures, table.concat(state, '|')}
            break
        end
        -- An id whose message is gone was acknowledged already (a duplicate): skip it.
        popped = redis.call('ZPOPMIN', KEYS[index])
    end
    if taken ~= 0 then
        break
    end
end
-- Producers push a wake-up only while some worker is registered idle.
local idle_ms = tonumber(ARGV[10])
if taken == 0 and idle_ms > 0 and #KEYS > 11 then
    redis.call('ZREMRANGEBYSCORE', KEYS[10], '-inf', now)
    redis.call('ZADD', KEYS[10], now + idle_ms, ARGV[2])
    redis.call('PEXPIRE', KEYS[10], idle_ms + 60000)
elseif taken ~= 0 and ARGV[11] == '1' then
    redis.call('ZREM', KEYS[10], ARGV[2])
end
if finished == 1 or taken ~= 0 then
    for key_index = 8, 9 do
        if redis.call('PTTL', KEYS[key_index]) < keep then
            redis.call('PEXPIRE', KEYS[key_index], keep)
        end
    end
end
return {finished, taken}
