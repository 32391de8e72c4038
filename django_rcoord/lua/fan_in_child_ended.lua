-- Count the end of one child of a fan-in (django_rcoord.queues.fan_in) whose callback is in
-- another queue group, and queue the callback, with every child's result, once all of them
-- have ended (see _fan_in). A child's end is counted once however often this runs for it:
-- the task that runs it is queued with the child's end (in the step that records it) and
-- runs at least once.
-- KEYS[1]  fan-in prefix of the callback's group (`rcoord:queue:{<group>}:fan-in:`)
-- KEYS[2]  the callback's group's messages HASH
-- KEYS[3]  the callback's queue's ready ZSET
-- KEYS[4]  the callback's group's queues HASH
-- KEYS[5]  the callback's group's incoming LIST (wakes its idle workers)
-- KEYS[6]  the callback's group's idle ZSET
-- Builds   KEYS[1] .. <fan-in id>: the fan-in's HASH (see _fan_in)
-- Builds   KEYS[3] .. ' key:<fair key>', KEYS[3] .. ' heads', KEYS[3] .. ' waiting',
--          KEYS[3] .. ' running': the lines of the queue's fair keys (see _ready)
-- ARGV[1]  the child's count, JSON (queues/fan_in.py; the record task_finish reads as a
--          finished task's fan_in): id (the fan-in's, its callback's task id), n (the
--          child's place, 1 to total), value (the child's place in the results, JSON: its
--          return value, a failure, or null), how (how it ended: 'ok', 'fail' (it failed,
--          and fails the fan-in), or 'failed' (it failed, and the fan-in goes on: policy
--          continue or ignore))
-- Returns  'fired' (the callback is queued), 'failed' (this child failed the fan-in: the
--          caller cancels the children left), 'counted', 'seen' (counted already) or
--          'gone' (no such fan-in: it expired)
--! include _fan_in
local count = cjson.decode(ARGV[1])
return fan_in_count(KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], count.id, count.n,
    count.value, count.how)
