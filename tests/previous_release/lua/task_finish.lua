-- Finish the tasks a worker ran (acknowledge, retry later, or dead-letter each) and, in the
-- same step, take its next tasks (up to a prefetch count), so that a busy worker needs one
-- round trip per batch of tasks. Both steps keep the tasks' result records (status, times,
-- worker ids, errors, return value) and the group's task metrics.
-- KEYS[1]  messages HASH (id -> message JSON)   KEYS[2] owners HASH (id -> worker id)
-- KEYS[3]  failures HASH (id -> failed attempts; id:lost -> deliveries whose worker died)
-- KEYS[4]  errors HASH (id -> last error)
-- KEYS[5]  results HASH of the group: <id> -> 'STATUS|started|last attempted|finished|workers'
--          (times in server ms, worker ids comma-separated), <id>:v -> return value JSON,
--          <id>:e -> errors JSON list, <id>:m -> the message of a finished task
-- KEYS[6]  results expiry ZSET (id -> when its finished record expires, ms)
-- KEYS[7]  idle ZSET of the group (worker id -> until when it waits for a wake-up, ms)
-- KEYS[8]  metrics HASH of the group: 'n<US>queue<US>task<US>outcome<US>bucket' -> runs that
--          ended so, by duration bucket; 's<US>queue<US>task<US>outcome' -> their run time, us;
--          'm<US>queue<US>minute % 60' -> 'minute:finished' (the last hour, per minute);
--          'h<US>queue<US>task' -> deliveries held back by the task's limits;
--          'c<US>queue<US>task' -> tasks cancelled (written by task_cancel)
--          (<US> is the byte 0x1f)
-- KEYS[9]  this worker's last exchange STRING (JSON: its nonce, what it finished and took),
--          so that a call retried after its reply was lost answers as the first one did
-- KEYS[10..] four per queue the worker watches, in priority order: ready ZSET (highest
--          priority first), in-flight ZSET, delayed ZSET, dead LIST
-- ARGV[1]  worker id   ARGV[2] lease, ms   ARGV[3] how long a finished result is kept, ms
-- ARGV[4]  ms this worker waits for a wake-up when it finds nothing (it is registered idle
--          for that long, so that producers wake it; 0: do not register)
-- ARGV[5]  '1' when this worker is registered idle (taking a task unregisters it)
-- ARGV[6]  how many tasks to take at most (0: none)
-- ARGV[7]  how many finished tasks follow
-- ARGV[8]  this exchange's nonce ('' for none): a call whose nonce is the last one stored in
--          KEYS[9] changes nothing and answers the stored finished flags and the tasks it took
--          that this worker still holds
-- ARGV[9..] ten values for each finished task: id, its queue's index (1-based, among the
--          queues), outcome ('ack' | 'retry' | 'defer' | 'later' | 'dead'; 'defer': this
--          worker cannot run it, back later for another, not a failed attempt but a
--          delivery; 'later': held back by its limits before it started, not a run at all:
--          its record loses this delivery's worker id, and it is counted as held back, not
--          as finished), error text (retry, defer, dead), delay ms (retry, defer, later), return
--          value JSON (ack), error entry JSON (retry, dead), metric labels
--          'queue<US>task', run time's duration bucket, run time us
--          A unique task acknowledged or made a dead letter drops its claim (a 'u:' field of
--          KEYS[5] its message names, see _unique); one retried or deferred keeps it.
-- Then, optionally, the follow-up tasks (on_success / on_failure) of finished tasks, queued
-- in this step when their task is acknowledged or made a dead letter while this worker
-- holds it: ARGV[9 + 10 * count] how many (none when absent), then nine values each: the
-- position of its task among the finished ones, task_enqueue's short-form ARGV (id,
-- message, queue name, priority, wake-up token lifetime, group keys' lifetime), its unique
-- claim's field ('' for none) and how long the claim lasts, ms; and five KEYS each, after
-- the queues' keys: task_enqueue's short-form KEYS (of a queue of this group).
-- Returns  {finished, taken}: finished holds 1 per finished task, or 0 when this worker no
--          longer held it (its lease ran out and another worker has it: nothing about it
--          is changed); taken holds {id, message, queue index, failures, record state} per
--          task taken. A task that lost a worker before (id:lost) is taken alone, so that a
--          task killing its workers does not count against the tasks taken with it.
--! include _ready
--! include _records
--! include _unique
-- KEYS[queue_keys(queue_index) + part] is a key of queue `queue_index` (1-based): part 1
-- ready, 2 in-flight, 3 delayed, 4 dead.
local function queue_keys(queue_index)
    return 9 + (queue_index - 1) * 4
end
local worker = ARGV[1]
local nonce = ARGV[8]
if nonce ~= '' then
    local stored = redis.call('GET', KEYS[9])
    local last = stored and cjson.decode(stored)
    if last and last.n == nonce then
        -- A retry of a call that ran: answer as it did, with the tasks still held.
        local taken = {}
        for _, entry in ipairs(last.t) do
            local id, queue_index = entry[1], entry[2]
            if redis.call('HGET', KEYS[2], id) == worker
                and redis.call('ZSCORE', KEYS[queue_keys(queue_index) + 2], id) then
                taken[#taken + 1] = {
                    id,
                    redis.call('HGET', KEYS[1], id),
                    queue_index,
                    tonumber(redis.call('HGET', KEYS[3], id) or '0'),
                    redis.call('HGET', KEYS[5], id),
                }
            end
        end
        return {last.f, taken}
    end
end
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
local lease = tonumber(ARGV[2])
local result_ttl = tonumber(ARGV[3])
local US = '\31'
-- The records' keys live as long as the longest-lived record needs (running tasks renew it).
local keep = result_ttl + lease

local finished = {}
local count = tonumber(ARGV[7])
local follow_ups = tonumber(ARGV[9 + count * 10] or '0')
local counted, per_minute = {}, {}
if count > 0 then
    -- Which of them this worker still holds: owned by it and in its queue's in-flight set.
    local ids, by_queue = {}, {}
    for task = 1, count do
        local base = 8 + (task - 1) * 10
        ids[task] = ARGV[base + 1]
        local queue_index = tonumber(ARGV[base + 2])
        by_queue[queue_index] = by_queue[queue_index] or {}
        table.insert(by_queue[queue_index], task)
    end
    local owners = redis.call('HMGET', KEYS[2], unpack(ids))
    local held = {}
    for queue_index, tasks in pairs(by_queue) do
        local queue_ids = {}
        for _, task in ipairs(tasks) do
            queue_ids[#queue_ids + 1] = ids[task]
        end
        local scores = redis.call('ZMSCORE', KEYS[queue_keys(queue_index) + 2], unpack(queue_ids))
        local gone = {}
        for position, task in ipairs(tasks) do
            if scores[position] and owners[task] == worker then
                held[task] = true
                gone[#gone + 1] = ids[task]
            end
        end
        if #gone > 0 then
            redis.call('ZREM', KEYS[queue_keys(queue_index) + 2], unpack(gone))
        end
    end
    local mine, states = {}, {}
    for task = 1, count do
        finished[task] = held[task] and 1 or 0
        if held[task] then
            mine[#mine + 1] = ids[task]
        end
    end
    if #mine > 0 then
        redis.call('HDEL', KEYS[2], unpack(mine))
        local raw_states = redis.call('HMGET', KEYS[5], unpack(mine))
        for position, id in ipairs(mine) do
            states[id] = parse_state(raw_states[position])
        end
    end
    local acked, acked_fields, record_fields, expiring = {}, {}, {}, {}
    local errors, delayed, dead = {}, {}, {}
    for task = 1, count do
        if held[task] then
            local base = 8 + (task - 1) * 10
            local id, queue_index, outcome = ids[task], tonumber(ARGV[base + 2]), ARGV[base + 3]
            local state = states[id]
            if outcome == 'ack' then
                state[1] = 'SUCCESSFUL'
                state[4] = now
                acked[#acked + 1] = id
                acked_fields[#acked_fields + 1] = id
                acked_fields[#acked_fields + 1] = id .. ':lost'
                record_fields[#record_fields + 1] = id .. ':v'
                record_fields[#record_fields + 1] = ARGV[base + 6]
                expiring[#expiring + 1] = now + result_ttl
                expiring[#expiring + 1] = id
            elseif outcome == 'later' then
                state[1] = 'READY'
                drop_last_delivery(state)
                local delay = tonumber(ARGV[base + 5])
                delayed[queue_index] = delayed[queue_index] or {}
                table.insert(delayed[queue_index], now + delay)
                table.insert(delayed[queue_index], id)
                keep = math.max(keep, result_ttl + lease + delay)
            else
                if outcome ~= 'defer' then  -- a deferral is not a failed attempt
                    add_error(KEYS[5], id, ARGV[base + 7])
                    redis.call('HINCRBY', KEYS[3], id, 1)
                end
                errors[#errors + 1] = id
                errors[#errors + 1] = ARGV[base + 4]
                if outcome == 'retry' or outcome == 'defer' then
                    state[1] = 'READY'
                    local delay = tonumber(ARGV[base + 5])
                    delayed[queue_index] = delayed[queue_index] or {}
                    table.insert(delayed[queue_index], now + delay)
                    table.insert(delayed[queue_index], id)
                    keep = math.max(keep, result_ttl + lease + delay)
                else
                    state[1] = 'FAILED'
                    state[4] = now
                    dead[queue_index] = dead[queue_index] or {}
                    table.insert(dead[queue_index], id)
                    expiring[#expiring + 1] = now + result_ttl
                    expiring[#expiring + 1] = id
                end
            end
            record_fields[#record_fields + 1] = id
            record_fields[#record_fields + 1] = table.concat(state, '|')
            -- Metrics, summed per field over the batch (one command per distinct field).
            local labels = ARGV[base + 8]
            if labels ~= '' and outcome == 'later' then
                local held_back = 'h' .. US .. labels
                counted[held_back] = (counted[held_back] or 0) + 1
            elseif labels ~= '' then
                local runs = 'n' .. US .. labels .. US .. outcome .. US .. ARGV[base + 9]
                local spent = 's' .. US .. labels .. US .. outcome
                counted[runs] = (counted[runs] or 0) + 1
                counted[spent] = (counted[spent] or 0) + tonumber(ARGV[base + 10])
                local queue = string.match(labels, '^[^\31]*')
                per_minute[queue] = (per_minute[queue] or 0) + 1
            end
        end
    end
    if #acked > 0 then
        -- A finished task's message moves into its record.
        local messages = redis.call('HMGET', KEYS[1], unpack(acked))
        for position, id in ipairs(acked) do
            unique_release(KEYS[5], id, messages[position])
            if messages[position] then
                record_fields[#record_fields + 1] = id .. ':m'
                record_fields[#record_fields + 1] = messages[position]
            end
        end
        redis.call('HDEL', KEYS[1], unpack(acked))
        redis.call('HDEL', KEYS[3], unpack(acked_fields))
        redis.call('HDEL', KEYS[4], unpack(acked))
    end
    if #record_fields > 0 then
        redis.call('HSET', KEYS[5], unpack(record_fields))
    end
    if #expiring > 0 then
        redis.call('ZADD', KEYS[6], unpack(expiring))
    end
    if #errors > 0 then
        redis.call('HSET', KEYS[4], unpack(errors))
    end
    for queue_index, members in pairs(delayed) do
        redis.call('ZADD', KEYS[queue_keys(queue_index) + 3], unpack(members))
    end
    for queue_index, members in pairs(dead) do
        redis.call('RPUSH', KEYS[queue_keys(queue_index) + 4], unpack(members))
        -- A dead letter keeps its message; its claim ends.
        local messages = redis.call('HMGET', KEYS[1], unpack(members))
        for position, id in ipairs(members) do
            unique_release(KEYS[5], id, messages[position])
        end
    end
    -- Follow-up tasks, queued with the end of the run they follow: only when this worker
    -- still held it (else its other run's worker queues them), after its record is final.
    local first_key = #KEYS - follow_ups * 5
    for follow_up = 1, follow_ups do
        local base = 9 + count * 10 + (follow_up - 1) * 9
        local task = tonumber(ARGV[base + 1])
        local outcome = ARGV[8 + (task - 1) * 10 + 3]
        if held[task] and (outcome == 'ack' or outcome == 'dead') then
            local k = first_key + (follow_up - 1) * 5
            local id, claim = ARGV[base + 2], ARGV[base + 8]
            if claim == '' or not unique_holder(KEYS[5], KEYS[k + 1], claim, now) then
                if claim ~= '' then
                    unique_claim(KEYS[5], claim, id, now, tonumber(ARGV[base + 9]))
                end
                enqueue_now(KEYS[k + 1], KEYS[k + 2], KEYS[k + 3], KEYS[k + 4], KEYS[k + 5],
                    ARGV[base + 4], tonumber(ARGV[base + 7]), id, ARGV[base + 3],
                    tonumber(ARGV[base + 5]), ARGV[base + 6])
            end
        end
    end
end
if count > 0 then
    -- Finished records expire a while later; drop a few that have.
    local expired = redis.call('ZRANGEBYSCORE', KEYS[6], '-inf', now, 'LIMIT', 0, 16)
    for _, old in ipairs(expired) do
        redis.call('HDEL', KEYS[5], old, old .. ':v', old .. ':e', old .. ':m')
    end
    if #expired > 0 then
        redis.call('ZREM', KEYS[6], unpack(expired))
    end
    for field, amount in pairs(counted) do
        redis.call('HINCRBY', KEYS[8], field, amount)
    end
    -- Finished per minute: a ring of 60 fields per queue, each 'minute:count'.
    local minute = math.floor(now / 60000)
    for queue, amount in pairs(per_minute) do
        local slot = 'm' .. US .. queue .. US .. (minute % 60)
        local at, seen = string.match(redis.call('HGET', KEYS[8], slot) or '', '^(%d+):(%d+)$')
        if tonumber(at) == minute then
            redis.call('HSET', KEYS[8], slot, minute .. ':' .. (tonumber(seen) + amount))
        else
            redis.call('HSET', KEYS[8], slot, minute .. ':' .. amount)
            -- As long as the group's other keys (GROUP_KEYS_MS) past its last task.
            redis.call('PEXPIRE', KEYS[8], keep + 30 * 24 * 3600 * 1000)
        end
    end
end

local taken = {}
local wanted = tonumber(ARGV[6])
local queues = (#KEYS - 9 - follow_ups * 5) / 4
for queue_index = 1, queues do
    if #taken >= wanted then
        break
    end
    local popped = redis.call('ZPOPMIN', KEYS[queue_keys(queue_index) + 1], wanted - #taken)
    local ids, scores = {}, {}
    for index = 1, #popped, 2 do
        ids[#ids + 1] = popped[index]
        scores[#scores + 1] = popped[index + 1]
    end
    if #ids > 0 then
        local fields = {}
        for index = 1, #ids do
            fields[#fields + 1] = ids[index]
            fields[#fields + 1] = ids[index] .. ':lost'
        end
        local messages = redis.call('HMGET', KEYS[1], unpack(ids))
        local failures = redis.call('HMGET', KEYS[3], unpack(fields))
        local raw_states = redis.call('HMGET', KEYS[5], unpack(ids))
        local leases, owners, records, put_back = {}, {}, {}, {}
        for index = 1, #ids do
            local id = ids[index]
            local lost = tonumber(failures[index * 2] or '0') > 0
            if lost and #taken > 0 then
                -- Taken alone: it goes back, with the tasks after it, for a later call; and
                -- no lower-priority queue fills the batch ahead of them.
                for rest = index, #ids do
                    put_back[#put_back + 1] = scores[rest]
                    put_back[#put_back + 1] = ids[rest]
                end
                wanted = #taken
                break
            end
            -- An id whose message is gone was acknowledged already (a duplicate): skip it.
            if messages[index] then
                leases[#leases + 1] = now + lease
                leases[#leases + 1] = id
                owners[#owners + 1] = id
                owners[#owners + 1] = worker
                local state = parse_state(raw_states[index])
                state[1] = 'RUNNING'
                if state[2] == '' then
                    state[2] = now
                end
                state[3] = now
                state[5] = state[5] == '' and worker or state[5] .. ',' .. worker
                local raw = table.concat(state, '|')
                records[#records + 1] = id
                records[#records + 1] = raw
                taken[#taken + 1] = {
                    id, messages[index], queue_index, tonumber(failures[index * 2 - 1] or '0'), raw
                }
                if lost then
                    for rest = index + 1, #ids do
                        put_back[#put_back + 1] = scores[rest]
                        put_back[#put_back + 1] = ids[rest]
                    end
                    wanted = #taken
                    break
                end
            end
        end
        if #leases > 0 then
            redis.call('ZADD', KEYS[queue_keys(queue_index) + 2], unpack(leases))
            redis.call('HSET', KEYS[2], unpack(owners))
            redis.call('HSET', KEYS[5], unpack(records))
        end
        if #put_back > 0 then
            redis.call('ZADD', KEYS[queue_keys(queue_index) + 1], unpack(put_back))
        end
    end
end
-- Producers push a wake-up only while some worker is registered idle.
local idle_ms = tonumber(ARGV[4])
if #taken == 0 and idle_ms > 0 and wanted > 0 then
    redis.call('ZREMRANGEBYSCORE', KEYS[7], '-inf', now)
    redis.call('ZADD', KEYS[7], now + idle_ms, worker)
    redis.call('PEXPIRE', KEYS[7], idle_ms + 60000)
elseif #taken > 0 and ARGV[5] == '1' then
    redis.call('ZREM', KEYS[7], worker)
end
if count > 0 or #taken > 0 then
    for key_index = 5, 6 do
        if redis.call('PTTL', KEYS[key_index]) < keep then
            redis.call('PEXPIRE', KEYS[key_index], keep)
        end
    end
end
if nonce ~= '' and (count > 0 or #taken > 0) then
    local refs = {}
    for index, entry in ipairs(taken) do
        refs[index] = {entry[1], entry[3]}
    end
    -- Long enough for the worker's retries (a lease at most).
    redis.call('SET', KEYS[9], cjson.encode({n = nonce, f = finished, t = refs}), 'PX', 2 * lease)
end
return {finished, taken}
