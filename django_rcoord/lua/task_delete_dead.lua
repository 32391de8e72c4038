-- Delete dead letters of a queue for good: the oldest (at most the call's batch), or one by
-- its id.
-- Their result records stay (FAILED, with their errors and message) until they expire.
-- KEYS[1]  dead LIST   KEYS[2] messages HASH   KEYS[3] failures HASH   KEYS[4] errors HASH
-- KEYS[5]  results HASH of the group (<id>:m keeps the message of a finished task)
-- ARGV[1]  the call, JSON (queues/records.py): batch (most dead letters to delete), id (the
--          id of the one to delete; '': the oldest)
-- Returns  how many were deleted (fewer than the batch: none are left).
--! include _dead
local call = cjson.decode(ARGV[1])
local ids = dead_letters(KEYS[1], call)
for _, id in ipairs(ids) do
    local message = redis.call('HGET', KEYS[2], id)
    if message and redis.call('HEXISTS', KEYS[5], id) == 1 then
        redis.call('HSET', KEYS[5], id .. ':m', message)
    end
    redis.call('HDEL', KEYS[2], id)
    redis.call('HDEL', KEYS[3], id, id .. ':lost')
    redis.call('HDEL', KEYS[4], id)
end
trim_dead(KEYS[1], call, #ids)
return #ids
