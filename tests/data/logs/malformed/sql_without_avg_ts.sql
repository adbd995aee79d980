INSERT INTO llama_bench (n_prompt, n_gen) VALUES ('0', '128');
