-- Read the record of one task (queues.get_result), writing nothing: what the task's queued
-- message, its record and its last error say, in one step. get_result reads a finished
-- record with one HGETALL; this script answers for the others.
-- KEYS[1]  messages HASH (task id -> its message while it is queued)
-- KEYS[2]  results HASH: the state of a queued or running task (<id> -> 'STATUS|started|
--          last attempted|finished|worker ids'), and the records a previous release wrote
--          (<id> -> the state, <id>:v -> return value, <id>:e -> errors, <id>:m -> message
--          of a finished task), read first: it wrote them last
-- KEYS[3]  results expiry ZSET of a previous release (task id -> server ms at which its
--          record expires)
-- KEYS[4]  errors HASH (task id -> the last error of a failed attempt)
-- KEYS[5]  record prefix of the group (`rcoord:queue:{<group>}:r:`, no key of its own)
-- Builds   KEYS[5] .. <task id>: the task's record HASH (see _records: s, v, e, m, x)
-- KEYS[6]  incoming LIST of the group (tasks pushed and not placed yet: see _incoming)
-- ARGV[1]  task id
-- Returns  {message, state, value, errors, finished message, last error, expired, pushed}:
--          nil for what is absent; expired is 1 when a previous release's record expired
--          (not swept yet); pushed is how many entries the incoming LIST holds when nothing
--          of the task was found (0 otherwise): get_result then places them and reads again
local id = ARGV[1]
local fields = redis.call('HMGET', KEYS[2], id, id .. ':v', id .. ':e', id .. ':m')
local record = KEYS[5] .. id
local own = redis.call('HMGET', record, 's', 'v', 'e', 'm', 'x')
local expired = 0
local last_error = false
if fields[1] then
    -- Only a finished record expires (a requeued dead letter's expiry goes with it).
    local status = string.match(fields[1], '^[^|]*')
    local expires = (status == 'SUCCESSFUL' or status == 'FAILED' or status == 'CANCELLED')
        and redis.call('ZSCORE', KEYS[3], id)
    if expires then
        local now = redis.call('TIME')
        if tonumber(expires) <= now[1] * 1000 + math.floor(now[2] / 1000) then
            expired = 1
        end
    end
    -- The errors of this release's attempts are in the record, before a previous release's.
    if own[3] and fields[3] then
        fields[3] = string.sub(own[3], 1, -2) .. ',' .. string.sub(fields[3], 2)
    else
        fields[3] = fields[3] or own[3]
    end
else
    fields = own
    last_error = fields[5] or false
end
local status = fields[1] and string.match(fields[1], '^[^|]*')
-- An acknowledged task's message is in its record and its errors hold no entry: neither is
-- read again.
local message = false
if not fields[4] then
    message = redis.call('HGET', KEYS[1], id)
end
if status ~= 'SUCCESSFUL' and not last_error then
    last_error = redis.call('HGET', KEYS[4], id)
end
local pushed = 0
if not message and not fields[1] then
    pushed = redis.call('LLEN', KEYS[6])
end
return {message, fields[1], fields[2], fields[3], fields[4], last_error, expired, pushed}
