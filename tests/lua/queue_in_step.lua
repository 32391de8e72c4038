-- A project's own script that queues a task in its step, and nothing else: it passes its
-- KEYS and ARGV (enqueue_in_script's, in order) straight on to the enqueue helper.
-- Builds   KEYS[2] .. ' key:<fair key>', KEYS[2] .. ' heads', KEYS[2] .. ' waiting',
--          KEYS[2] .. ' running': the lines of the queue's fair keys (see _ready)
--! include django_rcoord:_enqueue
return enqueue_task(KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7], ARGV[1],
    ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6], ARGV[7], ARGV[8])
