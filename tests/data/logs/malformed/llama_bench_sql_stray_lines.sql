BEGIN TRANSACTION;
INSERT INTO llama_bench (gpu_info, model_type, n_prompt, n_gen, n_depth, avg_ts) VALUES ('Apple M3 Max', 'x 1B', '0', '128', '0', '50.5');
INSERT INTO llama_bench (gpu_info, model_type, n_prompt, n_gen, n_depth, avg_ts) VALUES ('Apple M3 Max', 'x 1B', '512', '0', '0', '1500.25');
COMMIT;
