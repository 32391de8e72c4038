-- Record a queue group in the registry pollers read (no SCAN), waking them when it is new.
-- KEYS[1]  groups SET (queue group names)   KEYS[2] wake LIST of the pollers
-- ARGV[1]  group name   ARGV[2] how long the registry outlives its last use, ms
-- ARGV[3]  wake-up token lifetime, ms
-- Returns  1 when the group is new, else 0
local added = redis.call('SADD', KEYS[1], ARGV[1])
redis.call('PEXPIRE', KEYS[1], ARGV[2])
if added == 1 then
    redis.call('RPUSH', KEYS[2], 1)
    redis.call('LTRIM', KEYS[2], -16, -1)
    redis.call('PEXPIRE', KEYS[2], ARGV[3])
end
return added
