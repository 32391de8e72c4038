#!lua flags=no-writes
-- task_result.lua declared read-only (Redis 7+), so that it may run on replicas (EVALSHA_RO)
-- and while the server refuses writes. Servers before 7 cannot compile the first line: they
-- run task_result.lua, the same script without it.
-- KEYS[1]..KEYS[6], ARGV[1], Returns: as task_result.lua's.
-- Builds   KEYS[5] .. <task id>: the task's record HASH (see task_result.lua)
--! include task_result
