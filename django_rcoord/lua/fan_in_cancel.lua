-- Cancel a fan-in that waits for its children (django_rcoord.queues.fan_in.cancel_fan_in):
-- its callback will not be queued. The caller cancels its children.
-- KEYS[1]  fan-in prefix of the callback's group (`rcoord:queue:{<group>}:fan-in:`)
-- Builds   KEYS[1] .. <fan-in id>: the fan-in's HASH (see fan_in_child_ended)
-- ARGV[1]  fan-in id
-- Returns  1 when it was waiting, else 0 (its callback queued, failed, cancelled, unknown)
local fan_in = KEYS[1] .. ARGV[1]
if redis.call('HGET', fan_in, 'state') ~= 'waiting' then
    return 0
end
redis.call('HSET', fan_in, 'state', 'cancelled')
redis.call('PEXPIRE', fan_in, redis.call('HGET', fan_in, 'ttl_ms'))
return 1
