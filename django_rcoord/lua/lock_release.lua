-- Release a lock if the caller still holds it, and wake one waiter.
-- KEYS[1]  owner key
-- KEYS[2]  signal key (LIST: at most one wake-up token that waiters BLPOP)
-- ARGV[1]  identifier of the caller
-- ARGV[2]  lifetime of an unconsumed wake-up token, in milliseconds
-- Returns  1 when released, 0 when the caller no longer held the lock (nothing is changed).
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
    return 0
end
redis.call('DEL', KEYS[1])
-- One token wakes one waiter; a token nobody takes expires instead of piling up.
redis.call('DEL', KEYS[2])
redis.call('RPUSH', KEYS[2], 1)
redis.call('PEXPIRE', KEYS[2], ARGV[2])
return 1
