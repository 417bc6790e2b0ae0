-- Placeholder for helper vocab's 0002 (branch h-vocab), so that 0003 loads
-- on this branch (gaps are refused). Delete this file when merging h-vocab.
SELECT 1;
