-- Read the record of one task (queues.get_result), writing nothing: what the task's queued
-- message, its result fields and its last error say, in one step.
-- KEYS[1]  messages HASH (task id -> its message while it is queued)
-- KEYS[2]  results HASH (<id> -> 'STATUS|started|last attempted|finished|worker ids',
--          <id>:v -> return value, <id>:e -> errors, <id>:m -> message of a finished task)
-- KEYS[3]  results expiry ZSET (task id -> server ms at which its record expires)
-- KEYS[4]  errors HASH (task id -> the last error of a failed attempt)
-- ARGV[1]  task id
-- Returns  {message, state, value, errors, finished message, last error, expired}: nil for
--          what is absent; expired is 1 when the record's expiry passed (not swept yet).
local id = ARGV[1]
local fields = redis.call('HMGET', KEYS[2], id, id .. ':v', id .. ':e', id .. ':m')
local status = fields[1] and string.match(fields[1], '^[^|]*')
-- Only a finished record expires (a requeued dead letter's expiry goes with it).
local expired = 0
if status == 'SUCCESSFUL' or status == 'FAILED' or status == 'CANCELLED' then
    local expires = redis.call('ZSCORE', KEYS[3], id)
    if expires then
        local now = redis.call('TIME')
        if tonumber(expires) <= now[1] * 1000 + math.floor(now[2] / 1000) then
            expired = 1
        end
    end
end
-- An acknowledged task's message is in its record (<id>:m) and its errors hold no entry:
-- neither is read again.
local message, last_error = false, false
if not fields[4] then
    message = redis.call('HGET', KEYS[1], id)
end
if status ~= 'SUCCESSFUL' then
    last_error = redis.call('HGET', KEYS[4], id)
end
return {message, fields[1], fields[2], fields[3], fields[4], last_error, expired}
