-- Finish the tasks a worker ran (acknowledge, retry later, or dead-letter each) and, in the
-- same step, take its next tasks (up to a prefetch count), so that a busy worker needs one
-- round trip per batch of tasks. Both steps keep the tasks' result records (status, times,
-- worker ids, errors, return value) and the group's task metrics. Its steps, in order:
-- _finish (the tasks finished), _follow_ups (the tasks they queue), _metrics (their
-- counts), _take (the next tasks), then _in_flight's clean-up. The worker's side:
-- queues/worker/finish.py.
-- KEYS[1]  messages HASH (id -> message JSON)   KEYS[2] owners HASH (id -> worker id)
-- KEYS[3]  failures HASH (id -> failed attempts; id:lost -> deliveries whose worker died)
-- KEYS[4]  errors HASH (id -> last error)
-- KEYS[5]  results HASH of the group: the state of each queued or running task
--          (<id> -> 'STATUS|started|last attempted|finished|workers', times in server ms,
--          worker ids comma-separated), the claims of unique tasks (see _unique), and the
--          records a previous release wrote (see _records)
-- KEYS[6]  record prefix of the group (`rcoord:queue:{<group>}:r:`, no key of its own)
-- Builds   KEYS[6] .. <task id>: each task's record HASH (see _records): the errors of its
--          failed attempts; once finished its state, return value, message and a dead
--          letter's last error, expiring result_ttl after it finished
-- KEYS[7]  idle ZSET of the group (worker id -> until when it waits for a wake-up, ms)
-- KEYS[8]  metrics HASH of the group: 'n<US>queue<US>task<US>outcome<US>bucket' -> runs that
--          ended so, by duration bucket; 's<US>queue<US>task<US>outcome' -> their run time, us;
--          'm<US>queue<US>minute % 60' -> 'minute:finished' (the last hour, per minute);
--          'h<US>queue<US>task' -> deliveries held back by the task's limits;
--          'c<US>queue<US>task' -> tasks cancelled (written by task_cancel)
--          (<US> is the byte 0x1f)
-- KEYS[9]  this worker's last exchange STRING (its nonce, what it finished and took: see
--          EXCHANGE below), so that a call retried after its reply was lost answers as the
--          first one did
-- KEYS[10] paused SET of the group: the names (within the group) of its queues that no
--          worker takes from (pause_queue); their tasks wait in their ready ZSETs
-- KEYS[11] queues HASH of the group (each queue's counter: a fair key's next task joins
--          its ready ZSET with a fresh one)
-- KEYS[12..] four per queue the worker watches, in priority order: ready ZSET (highest
--          priority first), in-flight ZSET, delayed ZSET, dead LIST; then the group's
--          incoming LIST and its ready prefix (`rcoord:queue:{<group>}:ready:`, no key of its
--          own; ARGV[1]'s incoming says where they are: see _incoming); then the follow-ups'
--          and the fan-in counts' keys (each says where its own start)
-- Builds   <ready prefix> .. <queue>: the ready ZSET of each queue of the group an incoming
--          entry names (see _incoming)
-- Builds   KEYS[k] .. <fan-in id>: the HASH of the fan-in a finished task is a child of,
--          KEYS[k] its fan-in count's first key, the fan-in prefix of this group (see
--          _fan_in)
-- Builds   KEYS[12] .. ' key:<fair key>', KEYS[12] .. ' heads', KEYS[12] .. ' waiting',
--          KEYS[12] .. ' running' (and so for each queue's ready ZSET): the lines of a
--          queue's fair keys (see _ready)
-- ARGV[1]  the call, JSON: worker (its id), lease (ms), result_ttl (how long a finished
--          result is kept, ms), idle_ms (how long this worker waits for a wake-up when it
--          finds nothing: it is registered idle for that long, so that producers wake it;
--          0: do not register), registered (true when it is registered idle: taking a task
--          unregisters it), take (how many tasks to take at most, 0: none), queues (how
--          many queues it watches), names (each queue's name within its group, in the
--          order of its keys: the members of KEYS[10]), incoming (the position of the
--          incoming LIST among KEYS, its ready prefix next: a call that takes places what
--          it holds first), nonce ('' for none: a call whose
--          nonce is the last one stored in KEYS[9] changes nothing and answers the stored
--          finished flags and the tasks it took that this worker still holds)
-- ARGV[2..] one JSON record per finished task (a field named with outcomes is read for
--          those only, and may be left out of the others): id; queue (its queue's index,
--          1-based, among the queues); outcome ('ack' | 'retry' | 'defer' | 'later' | 'dead';
--          'defer': this worker cannot run it, back later for another, not a failed attempt
--          but a delivery; 'later': held back by its limits before it started, not a run at
--          all: its record loses this delivery's worker id, and it is counted as held back,
--          not as finished); error (its text: retry, defer, dead); delay (ms: retry, defer,
--          later); value (the return value's JSON: ack); entry (the error entry's JSON:
--          retry, dead); labels ('queue<US>task', '' for none), bucket (the run time's
--          duration bucket) and us (the run time) for the metrics; and optionally
--          follow_ups, the tasks it queues when it is acknowledged or made a dead letter,
--          and fan_in, its count in its fan-in (see _follow_ups); and fair_key, the run's
--          fair key when its key has a limit of running tasks (max_running_per_key): its
--          end lets the key's next task in (see _ready). A unique task
--          acknowledged or made a dead letter drops its claim (a 'u:' field of KEYS[5] its
--          message names, see _unique); one retried or deferred keeps it.
--          A plain acknowledgement (no follow_ups, fan_in or fair_key: most records) comes
--          in a compact form instead, decoded by one string.match where cjson.decode cost
--          more than the rest of its parsing: the byte 0x1e (RS, which no JSON text starts
--          with or holds unescaped), then id, queue, labels, bucket, us and value, apart by
--          RS (finish.py's wire_record builds both forms).
-- Returns  {finished, taken}: finished holds 1 per finished task, or 0 when this worker no
--          longer held it (its lease ran out and another worker has it: nothing about it
--          is changed); taken holds {id, message, queue index, failures, record state} per
--          task taken (see _take).
--! include _ready
--! include _records
--! include _unique
--! include _finish
--! include _follow_ups
--! include _metrics
--! include _in_flight
--! include _take
--! include _incoming
local call = cjson.decode(ARGV[1])
local worker, nonce = call.worker, call.nonce
local group = {
    messages = KEYS[1], owners = KEYS[2], failures = KEYS[3], errors = KEYS[4],
    results = KEYS[5], records = KEYS[6], idle = KEYS[7], metrics = KEYS[8],
    exchange = KEYS[9], paused = KEYS[10], queues = KEYS[11],
}
local queues = {}
for index = 1, call.queues do
    local first = 11 + (index - 1) * 4
    queues[index] = {
        ready = KEYS[first + 1], in_flight = KEYS[first + 2],
        delayed = KEYS[first + 3], dead = KEYS[first + 4],
    }
end
-- The last exchange, one string (written per call, read only when a call is retried):
-- '<nonce><RS><finished flags, a digit each><RS><id><US><queue index><RS>...' per task
-- taken (RS, US: the bytes 0x1e, 0x1f (US: _metrics'), in no nonce, id or index). Cheaper
-- to build and to test than a JSON record: a call that is no retry reads only the nonce
-- in front.
local RS = '\30'
-- A plain acknowledgement's compact record: RS, then its fields apart by RS.
local ACK_FORM = '^\30([^\30]*)\30([^\30]*)\30([^\30]*)\30([^\30]*)\30([^\30]*)\30(.*)$'
if nonce ~= '' then
    local stored = redis.call('GET', group.exchange)
    if stored and string.sub(stored, 1, #nonce + 1) == nonce .. RS then
        -- A retry of a call that ran: answer as it did, with the tasks still held.
        local parts = {}
        for part in string.gmatch(string.sub(stored, #nonce + 2) .. RS, '([^\30]*)\30') do
            parts[#parts + 1] = part
        end
        local flags, taken = {}, {}
        for at = 1, #parts[1] do
            flags[at] = tonumber(string.sub(parts[1], at, at))
        end
        for index = 2, #parts do
            local id, queue_text = string.match(parts[index], '^(.*)\31(%d+)$')
            local queue_index = tonumber(queue_text)
            if redis.call('HGET', group.owners, id) == worker
                and redis.call('ZSCORE', queues[queue_index].in_flight, id) then
                taken[#taken + 1] = {
                    id,
                    redis.call('HGET', group.messages, id),
                    queue_index,
                    tonumber(redis.call('HGET', group.failures, id) or '0'),
                    redis.call('HGET', group.results, id),
                }
            end
        end
        return {flags, taken}
    end
end
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
-- How long the group's metrics must live at least (longer for a task that waits longer).
local keep = call.result_ttl + call.lease

local tasks, finished = {}, {}
for index = 2, #ARGV do
    local text = ARGV[index]
    if string.byte(text) == 30 then
        -- A plain acknowledgement, in its compact form (see the header).
        local id, queue, labels, bucket, us, value = string.match(text, ACK_FORM)
        tasks[index - 1] = {
            id = id, queue = tonumber(queue), outcome = 'ack', labels = labels,
            bucket = bucket, us = tonumber(us), value = value,
        }
    else
        tasks[index - 1] = cjson.decode(text)
    end
end
if #tasks > 0 then
    local held, mine = take_back_held(group, queues, worker, tasks)
    for position = 1, #tasks do
        finished[position] = held[position] and 1 or 0
    end
    keep = finish_held(group, queues, tasks, held, mine, now, call.result_ttl, call.lease, keep)
    for position, task in ipairs(tasks) do
        -- A run of a key with a limit of running tasks ended: its key may admit the next.
        if held[position] and task.fair_key then
            fair_ended(queues[task.queue].ready, group.queues, call.names[task.queue],
                task.fair_key)
        end
    end
    queue_follow_ups(group.results, tasks, held, now)
    count_runs(group.metrics, tasks, held, now, keep)
end

-- A call that takes nothing (a task finished alone) does not look for paused queues, nor
-- place what producers pushed.
if call.take > 0 then
    place_incoming(KEYS[call.incoming], KEYS[call.incoming + 1], group.messages, group.queues,
        GROUP_KEYS_MS, INCOMING_BATCH)
end
local skip = call.take > 0 and paused_queues(group.paused, call.names) or {}
local taken, wanted = take_tasks(group, queues, call.names, worker, call.take, now, call.lease,
    skip)
if #tasks > 0 then
    -- After the take, which may have added to them: the keys go with their last task.
    local touched = {}
    for _, task in ipairs(tasks) do
        if not touched[task.queue] then
            touched[task.queue] = true
            drop_emptied_in_flight(queues[task.queue].in_flight)
        end
    end
    drop_emptied_owners(group.owners)
end
-- Producers push a wake-up only while some worker is registered idle.
if #taken == 0 and call.idle_ms > 0 and wanted > 0 then
    redis.call('ZREMRANGEBYSCORE', group.idle, '-inf', now)
    redis.call('ZADD', group.idle, now + call.idle_ms, worker)
    redis.call('PEXPIRE', group.idle, call.idle_ms + 60000)
elseif #taken > 0 and call.registered then
    redis.call('ZREM', group.idle, worker)
end
if nonce ~= '' and (#tasks > 0 or #taken > 0) then
    local parts = {nonce, table.concat(finished)}
    for index, entry in ipairs(taken) do
        parts[index + 2] = entry[1] .. US .. entry[3]
    end
    -- Long enough for the worker's retries (a lease at most) and for its client's own
    -- (its socket timeout times its retries), which can outlast a short lease: twice the
    -- lease, and five minutes at least. One key per worker.
    redis.call('SET', group.exchange, table.concat(parts, RS), 'PX',
        math.max(2 * call.lease, 300000))
end
return {finished, taken}
