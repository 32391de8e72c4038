-- Delete dead letters of a queue for good: the oldest (at most ARGV[1]), or one by its id.
-- Their result records stay (FAILED, with their errors and message) until they expire.
-- KEYS[1]  dead LIST   KEYS[2] messages HASH   KEYS[3] failures HASH   KEYS[4] errors HASH
-- KEYS[5]  results HASH of the group (<id>:m keeps the message of a finished task)
-- ARGV[1]  most dead letters to delete   ARGV[2] (optional) the id of the one to delete
-- Returns  how many were deleted (fewer than ARGV[1]: none are left).
local ids
if ARGV[2] and ARGV[2] ~= '' then
    ids = {}
    if redis.call('LREM', KEYS[1], 1, ARGV[2]) == 1 then
        ids[1] = ARGV[2]
    end
else
    ids = redis.call('LRANGE', KEYS[1], 0, tonumber(ARGV[1]) - 1)
    if #ids > 0 then
        redis.call('LTRIM', KEYS[1], #ids, -1)
    end
end
for _, id in ipairs(ids) do
    local message = redis.call('HGET', KEYS[2], id)
    if message and redis.call('HEXISTS', KEYS[5], id) == 1 then
        redis.call('HSET', KEYS[5], id .. ':m', message)
    end
    redis.call('HDEL', KEYS[2], id)
    redis.call('HDEL', KEYS[3], id, id .. ':lost')
    redis.call('HDEL', KEYS[4], id)
end
return #ids
