-- Placeholder for helper ractors's 0003 (branch h-ractors), so that 0004
-- loads on this branch (gaps are refused). Delete this file when merging
-- h-ractors.
SELECT 1;
