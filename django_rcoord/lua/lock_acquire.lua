-- Take a lock if it is free, and hand out its next fencing token.
-- KEYS[1]  owner key (STRING: the holder's identifier, with a TTL)
-- KEYS[2]  fence key (STRING counter: the last fencing token granted for this name)
-- ARGV[1]  identifier of the caller
-- ARGV[2]  lock TTL in milliseconds
-- Returns  the fencing token (> 0) when the lock was taken;
--          otherwise minus the holder's remaining TTL in milliseconds (<= 0; 0 when it has none).
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
    return redis.call('INCR', KEYS[2])
end
local remaining = redis.call('PTTL', KEYS[1])
if remaining < 0 then
    return 0
end
return -remaining
