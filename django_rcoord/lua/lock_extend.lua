-- Reset the TTL of a lock the caller still holds.
-- KEYS[1]  owner key
-- ARGV[1]  identifier of the caller
-- ARGV[2]  new TTL in milliseconds, counted from now
-- Returns  1 when extended, 0 when the caller no longer held the lock (nothing is changed).
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
    return 0
end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return 1
