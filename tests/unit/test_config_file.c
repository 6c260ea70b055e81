/* Unit tests for the DeepSpeed-style JSON config file of the training
 * options (options/config_file.c): its sections and keys, "auto",
 * keys with no effect here, every error of a file at once (each one line
 * naming the key path), Lightning's precision names, and flags beating
 * the file.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <errno.h>
#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>
#include <cmocka.h>
#include "options/config.h"
#include "options/config_internal.h" /* hpu__repeated_keys */
#include "common/fileio.h" /* hpu__read_file */
#include "tests/unit/config_testlib.h"

/* --config through the flags, on top of the defaults, resolved for world
 * 2; returns the notes hpu__opts_config_notes prints (malloc'd). Flags in
 * `before` come first on the command line. */
static char *notes_of(const char *json, char **before, hpu_train_opts *o)
{
	char path[64], err[2048] = "", *text = NULL;
	size_t len = 0;
	write_temp(json, path);
	hpu__opts_defaults(o);
	for (int k = 0; before && before[k]; k += 2)
		assert_int_equal(hpu__opts_set(o, before[k], before[k + 1], err, sizeof err), 0);
	int rc = hpu__opts_set(o, "config", path, err, sizeof err);
	if (rc == 0)
		rc = hpu__opts_resolve(o, 2, err, sizeof err);
	unlink(path);
	if (rc != 0)
		fail_msg("%s did not load: %s", json, err);
	FILE *f = open_memstream(&text, &len);
	hpu__opts_config_notes(o, f, "hpulaunch");
	fclose(f);
	printf("%s", text);
	return text;
}

static void assert_has(const char *text, const char *needle)
{
	if (!strstr(text, needle))
		fail_msg("\"%s\" is not in:\n%s", needle, text);
}

/* WarmupDecayLR with fewer total steps than warm-up steps: DeepSpeed
 * warns and runs (warm-up, then warmup_min_lr), and so does this, naming
 * the file's keys (it was refused naming --total-steps and
 * --warmup-steps, flags never given). */
static void test_warmup_decay_short_total(void **state)
{
	(void)state;
	hpu_train_opts o;
	char *text = notes_of("{'scheduler': {'type': 'WarmupDecayLR', 'params': {"
			      "'warmup_num_steps': 5, 'total_num_steps': 3, 'warmup_max_lr': 0.1}}}",
			      NULL, &o);
	assert_has(text, "hpulaunch: warning: --scheduler warmup_decay: "
			 "scheduler.params.total_num_steps 3 is less than "
			 "scheduler.params.warmup_num_steps 5: the lr warms up over 5 steps, then is "
			 "the warm-up min lr (DeepSpeed's WarmupDecayLR warns of the same)\n");
	free(text);
}

static void test_file_top_and_zero(void **state)
{
	(void)state;
	hpu_train_opts o;
	load_ok("{'train_batch_size': 512, 'train_micro_batch_size_per_gpu': 16,"
		" 'gradient_accumulation_steps': 8, 'gradient_clipping': 1.0,"
		" 'steps_per_print': 10,"
		" 'zero_optimization': {'stage': 2, 'reduce_bucket_size': 5e8,"
		"  'allgather_bucket_size': 2e8, 'overlap_comm': false,"
		"  'stage3_prefetch_bucket_size': 1e7,"
		"  'stage3_param_persistence_threshold': 1e4,"
		"  'stage3_max_live_parameters': 3e9,"
		"  'contiguous_gradients': true}}",
		&o);
	assert_int_equal(o.batch_size, 512);
	assert_int_equal(o.micro_batch, 16);
	assert_int_equal(o.grad_accum, 8);
	assert_true(o.clip_norm == 1.0);
	assert_int_equal(o.log_every, 10);
	assert_int_equal(o.strategy, HPU_STRATEGY_ZERO2);
	assert_int_equal(o.reduce_bucket, 500000000);
	assert_int_equal(o.allgather_bucket, 200000000);
	assert_int_equal(o.overlap_comm, 0);
	assert_int_equal(o.prefetch_bucket, 10000000);
	assert_int_equal(o.persistence_threshold, 10000);
	assert_int_equal(o.max_live_params, 3000000000L);

	const hpu_strategy stages[] = {HPU_STRATEGY_DDP, HPU_STRATEGY_ZERO1,
				       HPU_STRATEGY_ZERO2, HPU_STRATEGY_ZERO3};
	const char *json[] = {"{'zero_optimization': {'stage': 0}}",
			      "{'zero_optimization': {'stage': 1}}",
			      "{'zero_optimization': {'stage': 2.0}}",
			      "{'zero_optimization': {'stage': 3}}"};
	for (int k = 0; k < 4; k++) {
		load_ok(json[k], &o);
		assert_int_equal(o.strategy, stages[k]);
	}
	load_ok("{}", &o);
	hpu_train_opts d;
	hpu__opts_defaults(&d);
	assert_memory_equal(&o, &d, sizeof(o));
}

static void test_file_optimizer(void **state)
{
	(void)state;
	hpu_train_opts o;
	load_ok("{'optimizer': {'type': 'AdamW', 'params': {'lr': 3e-4,"
		" 'betas': [0.8, 0.95], 'eps': 1e-6, 'weight_decay': 0.1}}}",
		&o);
	assert_int_equal(o.optimizer, HPU_OPTIM_ADAMW);
	assert_true(o.lr == 3e-4);
	assert_true(o.beta1 == 0.8);
	assert_true(o.beta2 == 0.95);
	assert_true(o.eps == 1e-6);
	assert_true(hpu__opts_weight_decay(&o) == 0.1);

	/* DeepSpeed's Adam is AdamW unless adam_w_mode is false */
	load_ok("{'optimizer': {'type': 'Adam', 'params': {'lr': 0.01}}}", &o);
	assert_int_equal(o.optimizer, HPU_OPTIM_ADAMW);
	load_ok("{'optimizer': {'type': 'adam', 'params': {'adam_w_mode': true}}}",
		&o);
	assert_int_equal(o.optimizer, HPU_OPTIM_ADAMW);
	load_ok("{'optimizer': {'type': 'Adam', 'params': {'adam_w_mode': false}}}",
		&o);
	assert_int_equal(o.optimizer, HPU_OPTIM_ADAM);
	load_ok("{'optimizer': {'type': 'ADAMW'}}", &o);
	assert_int_equal(o.optimizer, HPU_OPTIM_ADAMW);

	load_ok("{'optimizer': {'type': 'SGD', 'params': {'lr': 0.1,"
		" 'momentum': 0.5, 'nesterov': true, 'weight_decay': 0}}}",
		&o);
	assert_int_equal(o.optimizer, HPU_OPTIM_SGD);
	assert_true(o.lr == 0.1);
	assert_true(o.momentum == 0.5);
	assert_int_equal(o.nesterov, 1);
	assert_true(hpu__opts_weight_decay(&o) == 0);
	load_ok("{'optimizer': {'type': 'sgd', 'params': {'nesterov': false}}}",
		&o);
	assert_int_equal(o.nesterov, 0);

	/* keys left out take DeepSpeed's defaults where hputrain's differ:
	 * FusedAdam's weight_decay 0 (not AdamW's 0.01), torch.optim.SGD's
	 * momentum 0 (not 0.9); a flag still wins */
	load_ok("{'optimizer': {'type': 'AdamW', 'params': {'lr': 0.01}}}", &o);
	assert_true(hpu__opts_weight_decay(&o) == 0);
	assert_int_equal(o.from[hpu__opt_slot_named("weight-decay")], HPU_FROM_FILE);
	load_ok("{'optimizer': {'type': 'SGD', 'params': {'lr': 0.1}}}", &o);
	assert_true(o.momentum == 0);
	char path[64], err[512] = "";
	write_temp("{'optimizer': {'type': 'SGD'}}", path);
	hpu__opts_defaults(&o);
	assert_int_equal(hpu__opts_set(&o, "momentum", "0.8", err, sizeof err), 0);
	assert_int_equal(hpu__opts_load_file(&o, path, err, sizeof err), 0);
	assert_true(o.momentum == 0.8);
	unlink(path);
	load_ok("{'optimizer': {'type': 'Adam', 'params': {'adam_w_mode': false}}}", &o);
	assert_true(hpu__opts_weight_decay(&o) == 0);
	/* torch_adam: DeepSpeed builds torch's AdamW, whose default is 0.01 */
	load_ok("{'optimizer': {'type': 'AdamW', 'params': {'torch_adam': true}}}", &o);
	assert_true(hpu__opts_weight_decay(&o) == 0.01);
	/* Nesterov with the momentum left out (0): torch.optim.SGD refuses it */
	LOAD_ERROR("{'optimizer': {'type': 'SGD', 'params': {'nesterov': true}}}",
		   "optimizer.params.nesterov", "needs optimizer.params.momentum");

	LOAD_ERROR("{'optimizer': {'type': 'Lamb'}}", "optimizer.type", "Lamb");
	LOAD_ERROR("{'optimizer': {'params': {'lr': 1}}}", "optimizer.type",
		   "missing");
	LOAD_ERROR("{'optimizer': {'type': 'AdamW', 'params': {'momentum': 0.9}}}",
		   "optimizer.params.momentum", "AdamW");
	LOAD_ERROR("{'optimizer': {'type': 'SGD', 'params': {'betas': [0.9, 0.9]}}}",
		   "optimizer.params.betas", "SGD");
	LOAD_ERROR("{'optimizer': {'type': 'AdamW', 'params': {'adam_w_mode': true}}}",
		   "optimizer.params.adam_w_mode");
	LOAD_ERROR("{'optimizer': {'type': 'Adam', 'params': {'betas': [0.9]}}}",
		   "optimizer.params.betas", "two numbers", "got 1");
	LOAD_ERROR("{'optimizer': {'type': 'Adam', 'params': {'betas': [0.9, 1.5]}}}",
		   "optimizer.params.betas[1]", "1.5", "out of range");
	LOAD_ERROR("{'optimizer': {'type': 'SGD', 'params': {'nesterov': 1}}}",
		   "optimizer.params.nesterov", "true or false");
	LOAD_ERROR("{'optimizer': {'type': 'Adam', 'params': {'lrr': 1}}}",
		   "optimizer.params.lrr", "(did you mean 'lr'?)");
	LOAD_ERROR("{'optimizer': {'type': 'Adam', 'param': {}}}",
		   "optimizer.param", "did you mean 'params'");
	LOAD_ERROR("{'optimizer': 'Adam'}", "optimizer", "expected an object");
}

static void test_file_scheduler(void **state)
{
	(void)state;
	hpu_train_opts o;
	load_ok("{'scheduler': {'type': 'WarmupLR', 'params': {"
		" 'warmup_min_lr': 1e-5, 'warmup_max_lr': 2e-3,"
		" 'warmup_num_steps': 300, 'warmup_type': 'linear'}}}",
		&o);
	assert_int_equal(o.sched, HPU_SCHED_WARMUP);
	assert_true(o.warmup_min_lr == 1e-5);
	assert_true(o.lr == 2e-3);
	assert_int_equal(o.warmup_steps, 300);
	assert_int_equal(o.warmup_type, HPU_WARMUP_LINEAR);

	load_ok("{'scheduler': {'type': 'WarmupDecayLR', 'params': {"
		" 'warmup_num_steps': 10, 'total_num_steps': 1000,"
		" 'warmup_type': 'log'}}}",
		&o);
	assert_int_equal(o.sched, HPU_SCHED_WARMUP_DECAY);
	assert_int_equal(o.total_steps, 1000);
	assert_int_equal(o.warmup_type, HPU_WARMUP_LOG);

	load_ok("{'scheduler': {'type': 'StepLR', 'params': {'step_size': 7,"
		" 'gamma': 0.5}}}",
		&o);
	assert_int_equal(o.sched, HPU_SCHED_STEP);
	assert_int_equal(o.step_size, 7);
	assert_true(o.gamma == 0.5);

	load_ok("{'scheduler': {'type': 'CosineAnnealingLR', 'params': {"
		" 'T_max': 500, 'eta_min': 1e-6}}}",
		&o);
	assert_int_equal(o.sched, HPU_SCHED_COSINE);
	assert_int_equal(o.total_steps, 500);
	assert_true(o.min_lr == 1e-6);

	load_ok("{'scheduler': {'type': 'constant'}}", &o);
	assert_int_equal(o.sched, HPU_SCHED_CONSTANT);

	/* without warmup_max_lr, DeepSpeed's 0.001: the scheduler sets the lr
	 * at every step, whatever the optimizer's params gave (a flag wins) */
	load_ok("{'optimizer': {'type': 'AdamW', 'params': {'lr': 0.01}},"
		" 'scheduler': {'type': 'WarmupLR', 'params': {"
		" 'warmup_num_steps': 4}}}",
		&o);
	assert_true(o.lr == 0.001);
	/* ... and the lr the optimizer's section gave is said to change
	 * nothing */
	assert_non_null(strstr(o.cfg_ignored, "optimizer.params.lr\tWarmupLR and WarmupDecayLR "
						"without warmup_max_lr set the lr to DeepSpeed's "
						"0.001 at every step\n"));
	/* with warmup_max_lr, that is the lr: another optimizer lr is said
	 * to change nothing too (it was not), the same one not */
	load_ok("{'optimizer': {'type': 'AdamW', 'params': {'lr': 0.005}},"
		" 'scheduler': {'type': 'WarmupLR', 'params': {'warmup_max_lr': 0.01}}}",
		&o);
	assert_true(o.lr == 0.01);
	assert_non_null(strstr(o.cfg_ignored, "optimizer.params.lr\tthe scheduler's warmup_max_lr "
						"sets the lr at every step"));
	load_ok("{'optimizer': {'type': 'AdamW', 'params': {'lr': 0.01}},"
		" 'scheduler': {'type': 'WarmupLR', 'params': {'warmup_max_lr': 0.01}}}",
		&o);
	assert_null(strstr(o.cfg_ignored, "optimizer.params.lr"));
	load_ok("{'scheduler': {'type': 'WarmupDecayLR', 'params': {"
		" 'total_num_steps': 40}},"
		" 'optimizer': {'type': 'SGD', 'params': {'lr': 0.3}}}",
		&o);
	assert_true(o.lr == 0.001);
	load_ok("{'optimizer': {'type': 'SGD', 'params': {'lr': 0.3}},"
		" 'scheduler': {'type': 'StepLR'}}",
		&o);
	assert_true(o.lr == 0.3);
	char path[64], err[512] = "";
	write_temp("{'scheduler': {'type': 'WarmupLR'}}", path);
	hpu__opts_defaults(&o);
	assert_int_equal(hpu__opts_set(&o, "lr", "0.2", err, sizeof err), 0);
	assert_int_equal(hpu__opts_load_file(&o, path, err, sizeof err), 0);
	assert_true(o.lr == 0.2);
	unlink(path);

	/* warmup_max_lr is the lr, whatever the order of the sections */
	load_ok("{'scheduler': {'type': 'WarmupLR', 'params': {"
		" 'warmup_max_lr': 0.5}},"
		" 'optimizer': {'type': 'SGD', 'params': {'lr': 0.1}}}",
		&o);
	assert_true(o.lr == 0.5);

	LOAD_ERROR("{'scheduler': {'type': 'WarmupDecayLR', 'params': {"
		   "'warmup_num_steps': 10}}}",
		   "scheduler.params.total_num_steps", "WarmupDecayLR");
	LOAD_ERROR("{'scheduler': {'type': 'WarmupLR', 'params': {'gamma': 0.1}}}",
		   "scheduler.params.gamma", "WarmupLR");
	LOAD_ERROR("{'scheduler': {'type': 'OneCycle'}}", "scheduler.type",
		   "OneCycle");
	LOAD_ERROR("{'scheduler': {'type': 'WarmupLR', 'params': {"
		   "'warmup_type': 'cubic'}}}",
		   "scheduler.params.warmup_type", "cubic");
	LOAD_ERROR("{'scheduler': {'type': 'StepLR', 'params': {'step_size': 2.5}}}",
		   "scheduler.params.step_size", "2.5", "not an integer");
}

static void test_file_precision(void **state)
{
	(void)state;
	hpu_train_opts o;
	load_ok("{'bf16': {'enabled': false}, 'fp16': {'enabled': false,"
		" 'loss_scale': 0, 'initial_scale_power': 16,"
		" 'loss_scale_window': 1000, 'hysteresis': 2,"
		" 'min_loss_scale': 1}}",
		&o);
	assert_int_equal(o.precision, HPU_PREC_FP32);
	load_ok("{'bf16': {'enabled': true}}", &o);
	assert_int_equal(o.precision, HPU_PREC_BF16_MIXED);
	load_ok("{'fp16': {'enabled': true, 'loss_scale': 0, 'initial_scale_power': 12,"
		" 'loss_scale_window': 50, 'hysteresis': 3, 'min_loss_scale': 0.5}}",
		&o);
	assert_int_equal(o.precision, HPU_PREC_FP16_MIXED);
	assert_int_equal(o.initial_scale_power, 12);
	assert_int_equal(o.loss_scale_window, 50);
	assert_int_equal(o.hysteresis, 3);
	assert_true(o.min_loss_scale == 0.5);
	LOAD_ERROR("{'bf16': {'enabled': true}, 'fp16': {'enabled': true}}",
		   "only one of bf16.enabled, fp16.enabled and fp8.enabled");
	/* hputrain.precision beside an enabled section: refused in either
	 * order (the later key won, in silence); the same one agrees */
	LOAD_ERROR("{'bf16': {'enabled': true}, 'hputrain': {'precision': '16-mixed'}}",
		   "hputrain.precision: asks for 16-mixed, but bf16.enabled asked for bf16-mixed");
	LOAD_ERROR("{'hputrain': {'precision': 'fp32'}, 'bf16': {'enabled': true}}",
		   "hputrain.precision: asks for fp32, but bf16.enabled asked for bf16-mixed");
	load_ok("{'hputrain': {'precision': 'bf16'}, 'bf16': {'enabled': true}}", &o);
	assert_int_equal(o.precision, HPU_PREC_BF16_MIXED);
	load_ok("{'fp8': {'enabled': true, 'amax_history_len': 1024, 'margin': 1,"
		" 'amax_compute_algo': 'most_recent'}}",
		&o);
	assert_int_equal(o.precision, HPU_PREC_FP8);
	assert_int_equal(o.fp8_amax_history, 1024);
	assert_int_equal(o.fp8_margin, 1);
	assert_int_equal(o.fp8_amax_algo, HPU_FP8_ALGO_MOST_RECENT);
	LOAD_ERROR("{'fp8': {'enabled': true}, 'bf16': {'enabled': true}}",
		   "bf16.enabled", "only one of");
	LOAD_ERROR("{'fp8': {'amax_compute_algo': 'mean'}}", "fp8.amax_compute_algo", "mean");
	LOAD_ERROR("{'fp8': {'amax_history_len': 0}}", "fp8.amax_history_len");
	/* TE's recipe format: HYBRID is ours, E4M3 is not (HYBRID was an
	 * unknown key); DeepSpeed's consecutive_hysteresis true changes the
	 * scaler (it was listed as a key with no effect) */
	load_ok("{'fp8': {'enabled': true, 'fp8_format': 'HYBRID'}}", &o);
	assert_int_equal(o.precision, HPU_PREC_FP8);
	LOAD_ERROR("{'fp8': {'enabled': true, 'fp8_format': 'E4M3'}}", "fp8.fp8_format",
		   "\"E4M3\" is not supported: fp8 here is Transformer Engine's HYBRID recipe");
	load_ok("{'fp16': {'enabled': true, 'consecutive_hysteresis': false}}", &o);
	LOAD_ERROR("{'fp16': {'enabled': true, 'consecutive_hysteresis': true}}",
		   "fp16.consecutive_hysteresis", "true is not supported: the scaler restores");
	LOAD_ERROR("{'fp16': {'enabled': false, 'loss_scail': 0}}",
		   "fp16.loss_scail", "did you mean 'loss_scale'");
}

static const char *resolve_error(const char *json, char **before);

static void test_file_hputrain(void **state)
{
	(void)state;
	hpu_train_opts o;
	load_ok("{'hputrain': {'strategy': 'fast_ddp', 'epochs': 3,"
		" 'max_steps': 100, 'seed': 7, 'device_memory': '2GiB',"
		" 'activation_checkpointing': true, 'grad_comm_dtype': 'bf16',"
		" 'log_every': 5, 'metrics': '/tmp/m.jsonl',"
		" 'save_params': '/tmp/p.bin', 'eval': false}}",
		&o);
	assert_int_equal(o.strategy, HPU_STRATEGY_FAST_DDP);
	assert_int_equal(o.epochs, 3);
	assert_int_equal(o.max_steps, 100);
	assert_int_equal(o.seed, 7);
	assert_int_equal(o.device_memory, 2147483648ull);
	assert_int_equal(o.activation_checkpointing, 1);
	assert_int_equal(o.grad_comm_dtype, HPU_COMM_BF16);
	assert_int_equal(o.log_every, 5);
	assert_string_equal(o.metrics, "/tmp/m.jsonl");
	assert_string_equal(o.save_params, "/tmp/p.bin");
	assert_int_equal(o.eval, 0);

	/* dashes, as the flags are spelt; device memory as a number */
	load_ok("{'hputrain': {'max-steps': 9, 'device-memory': 1048576,"
		" 'grad-comm-dtype': 'fp32', 'save-params': 'x'}}",
		&o);
	assert_int_equal(o.max_steps, 9);
	assert_int_equal(o.device_memory, 1048576);
	assert_string_equal(o.save_params, "x");

	/* --allow-tf32 (PyTorch's allow_tf32) has its key, off by default */
	assert_int_equal(o.allow_tf32, 0);
	load_ok("{'hputrain': {'allow_tf32': true}}", &o);
	assert_int_equal(o.allow_tf32, 1);
	load_ok("{'hputrain': {'allow-tf32': false}}", &o);
	assert_int_equal(o.allow_tf32, 0);

	/* --collectives has its key, device by default */
	assert_int_equal(o.collectives, HPU_COLL_DEVICE);
	load_ok("{'hputrain': {'collectives': 'nccl'}}", &o);
	assert_int_equal(o.collectives, HPU_COLL_NCCL);
	LOAD_ERROR("{'hputrain': {'collectives': 'mpi'}}", "hputrain.collectives", "mpi");

	/* --save-params-format has its key too */
	load_ok("{'hputrain': {'save_params': 'p.st', 'save_params_format': 'raw'}}", &o);
	assert_int_equal(o.save_params_format, HPU_PARAMS_RAW);
	LOAD_ERROR("{'hputrain': {'save_params_format': 'npz'}}",
		   "hputrain.save_params_format", "npz");

	/* val_check_interval: a fraction of an epoch or a number of steps;
	 * anything else is said as both (it named --eval-every's range) */
	load_ok("{'hputrain': {'val_check_interval': 0.25}}", &o);
	assert_true(o.eval_every_epochs == 0.25);
	load_ok("{'hputrain': {'val_check_interval': 40}}", &o);
	assert_int_equal(o.eval_every, 40);
	LOAD_ERROR("{'hputrain': {'val_check_interval': 0}}",
		   "hputrain.val_check_interval: 0 is neither a fraction of an epoch (above 0, below 1) "
		   "nor a whole number of steps (1 or more)");
	LOAD_ERROR("{'hputrain': {'val_check_interval': 2.5}}", "2.5 is neither a fraction");

	/* two names of one option with two values are refused, naming both
	 * (the later in the table, Lightning's, was taken in silence); the
	 * same value under both is taken */
	LOAD_ERROR("{'hputrain': {'eval_every': 3, 'val_check_interval': 4}}",
		   "hputrain.val_check_interval: 4 for --eval-every, but hputrain.eval_every gave 3: "
		   "both keys set --eval-every; give one");
	LOAD_ERROR("{'hputrain': {'eval_every_epochs': 1, 'check_val_every_n_epoch': 2}}",
		   "hputrain.check_val_every_n_epoch: 2 for --eval-every-epochs, but "
		   "hputrain.eval_every_epochs gave 1");
	LOAD_ERROR("{'hputrain': {'val_check_interval': 0.5, 'eval_every_epochs': 0.25}}",
		   "but hputrain.eval_every_epochs gave 0.25");
	LOAD_ERROR("{'zero_optimization': {'stage3_prefetch_bucket_size': 1000, "
		   "'prefetch_bucket_size': 2000}}",
		   "zero_optimization.prefetch_bucket_size: 2000 for --prefetch-bucket-size, but "
		   "zero_optimization.stage3_prefetch_bucket_size gave 1000");
	load_ok("{'hputrain': {'eval_every': 4, 'val_check_interval': 4}}", &o);
	assert_int_equal(o.eval_every, 4);
	/* across sections the hputrain key wins over its top-level twin,
	 * whichever comes first in the file (a template's steps_per_print
	 * beside the user's hputrain.log_every) */
	load_ok("{'use_hpu_graphs_for_training': true, 'hputrain': {'graphs': false}}", &o);
	assert_int_equal(o.graphs, 0);
	load_ok("{'hputrain': {'graphs': false}, 'use_hpu_graphs_for_training': true}", &o);
	assert_int_equal(o.graphs, 0);
	load_ok("{'steps_per_print': 2000, 'hputrain': {'log_every': 10}}", &o);
	assert_int_equal(o.log_every, 10);
	/* Lightning's fraction beside its default check_val_every_n_epoch 1,
	 * written out, either order: the fraction (a review found the pair
	 * refused) */
	load_ok("{'hputrain': {'val_check_interval': 0.25, 'check_val_every_n_epoch': 1}}", &o);
	assert_true(o.eval_every_epochs == 0.25);
	load_ok("{'hputrain': {'check_val_every_n_epoch': 1, 'val_check_interval': 0.25}}", &o);
	assert_true(o.eval_every_epochs == 0.25);
	LOAD_ERROR("{'hputrain': {'val_check_interval': 0.25, 'check_val_every_n_epoch': 2}}",
		   "both keys set --eval-every-epochs; give one");
	load_ok("{'zero_optimization': {'stage3_max_live_parameters': 1e9, "
		"'max_live_parameters': 1e9}}", &o);
	/* a value the resolve refuses is named by its key, not by a flag the
	 * user did not pass ("--eval-every-epochs 0") */
	const char *e = resolve_error("{'hputrain': {'check_val_every_n_epoch': 0}}", NULL);
	assert_has(e, "hputrain.check_val_every_n_epoch 0: give a whole number of epochs from 1");
	assert_has(e, "(config file ");
	assert_null(strstr(e, "--eval-every-epochs"));

	/* hputrain.strategy beats zero_optimization.stage, either order */
	load_ok("{'hputrain': {'strategy': 'zero1'},"
		" 'zero_optimization': {'stage': 3}}",
		&o);
	assert_int_equal(o.strategy, HPU_STRATEGY_ZERO1);
	load_ok("{'zero_optimization': {'stage': 3},"
		" 'hputrain': {'strategy': 'fast_ddp'}}",
		&o);
	assert_int_equal(o.strategy, HPU_STRATEGY_FAST_DDP);

	LOAD_ERROR("{'hputrain': {'strategy': 'fsdp'}}", "hputrain.strategy",
		   "fsdp");
	LOAD_ERROR("{'hputrain': {'device_memory': 0}}",
		   "hputrain.device_memory");
	LOAD_ERROR("{'hputrain': {'device_memory': '12 parsecs'}}",
		   "hputrain.device_memory", "12 parsecs");
	LOAD_ERROR("{'hputrain': {'metrics': ''}}", "hputrain.metrics");
	LOAD_ERROR("{'hputrain': {'max_steps': 5, 'max-steps': 6}}",
		   "max-steps", "twice");
	LOAD_ERROR("{'hputrain': {'epoch': 2}}", "hputrain.epoch",
		   "did you mean 'epochs'");
}

/* "auto" values (Hugging Face's DeepSpeed files) take our flags and
 * defaults, and one note says what each became. */
static void test_file_auto(void **state)
{
	(void)state;
	hpu_train_opts o;
	char *t = notes_of(
		"{'train_batch_size': 'auto', 'train_micro_batch_size_per_gpu': 'auto',"
		" 'gradient_accumulation_steps': 'auto', 'gradient_clipping': 'auto',"
		" 'fp16': {'enabled': 'auto'}, 'bf16': {'enabled': 'auto'},"
		" 'optimizer': {'type': 'AdamW', 'params': {'lr': 'auto', 'betas': 'auto',"
		"   'eps': 'auto', 'weight_decay': 'auto'}},"
		" 'scheduler': {'type': 'WarmupDecayLR', 'params': {'warmup_min_lr': 'auto',"
		"   'warmup_max_lr': 'auto', 'warmup_num_steps': 'auto', 'total_num_steps': 'auto'}},"
		" 'zero_optimization': {'stage': 3, 'reduce_bucket_size': 'auto',"
		"   'stage3_prefetch_bucket_size': 'auto', 'stage3_param_persistence_threshold': 'auto'}}",
		(char *[]){"lr", "0.02", "precision", "bf16", NULL}, &o);
	assert_int_equal(o.batch_size, 256);
	assert_int_equal(o.micro_batch, 128);
	assert_true(o.lr == 0.02);
	assert_int_equal(o.precision, HPU_PREC_BF16_MIXED);
	assert_int_equal(o.sched, HPU_SCHED_WARMUP_DECAY);
	assert_int_equal(o.strategy, HPU_STRATEGY_ZERO3);
	assert_int_equal(o.ncfg_auto, 17);
	/* one line */
	assert_ptr_equal(strchr(t, '\n'), t + strlen(t) - 1);
	assert_has(t, "hpulaunch: note: ");
	assert_has(t, "\"auto\" values take hputrain's flags and defaults: ");
	assert_has(t, "train_batch_size=256 (--batch-size, default)");
	assert_has(t, "train_micro_batch_size_per_gpu=128 (--micro-batch-size, from the other two batch sizes)");
	assert_has(t, "gradient_accumulation_steps=1 (--grad-accum, default)");
	assert_has(t, "fp16.enabled=bf16-mixed (--precision)");
	assert_has(t, "optimizer.params.lr=0.02 (--lr)");
	assert_has(t, "optimizer.params.betas=[0.9, 0.999] (--beta1, --beta2, default)");
	assert_has(t, "scheduler.params.warmup_max_lr=0.02 (--lr)");
	assert_has(t, "scheduler.params.total_num_steps=the run's steps (--total-steps, default)");
	assert_has(t, "optimizer.params.weight_decay=0.01 (--weight-decay, default)");
	assert_has(t, "zero_optimization.reduce_bucket_size=6553600 (--reduce-bucket-size, default)");
	free(t);
	/* the global batch the two flags determine is not a default */
	t = notes_of("{'train_batch_size': 'auto'}",
		     (char *[]){"micro-batch-size", "8", "grad-accum", "2", NULL}, &o);
	assert_int_equal(o.batch_size, 32);
	assert_has(t, "train_batch_size=32 (--batch-size, from the other two batch sizes)");
	free(t);
	/* a key without "auto" is not in the note; no note without any */
	t = notes_of("{'train_batch_size': 64}", NULL, &o);
	assert_string_equal(t, "");
	free(t);
	/* a choice whose own value is auto takes it as that value (it was
	 * named in the note as DeepSpeed's placeholder) */
	t = notes_of("{'hputrain': {'save_params_format': 'auto'}}",
		     (char *[]){"save-params", "p.bin", NULL}, &o);
	assert_string_equal(t, "");
	assert_int_equal(o.ncfg_auto, 0);
	free(t);
}

/* Keys DeepSpeed accepts that change nothing here: accepted, named in
 * one warning with the reason, keys with one reason together. A top-level
 * key DeepSpeed does not know either is ignored, as DeepSpeed ignores it,
 * unless it is a misspelling of a known one. */
static void test_file_no_effect(void **state)
{
	(void)state;
	hpu_train_opts o;
	char *t = notes_of(
		"{'train_batch_size': 64, 'wall_clock_breakdown': false, 'timers': {},"
		" 'prescale_gradients': false, 'zero_allow_untested_optimizer': true,"
		" 'my_team_setting': 3, 'steps_per_print': 2000,"
		" 'zero_optimization': {'stage': 2, 'contiguous_gradients': true,"
		"   'reduce_scatter': true, 'allgather_partitions': true, 'sub_group_size': 1e9,"
		"   'stage3_gather_16bit_weights_on_model_save': true},"
		" 'optimizer': {'type': 'Adam', 'params': {'torch_adam': true, 'lr': 0.01}},"
		" 'bf16': {'enabled': true}}",
		NULL, &o);
	assert_int_equal(o.batch_size, 64);
	assert_int_equal(o.strategy, HPU_STRATEGY_ZERO2);
	assert_int_equal(o.precision, HPU_PREC_BF16_MIXED);
	assert_true(o.lr == 0.01);
	assert_ptr_equal(strchr(t, '\n'), t + strlen(t) - 1);
	assert_has(t, "hpulaunch: warning: ");
	assert_has(t, "keys with no effect in hputrain: ");
	assert_has(t, "wall_clock_breakdown, timers (timings and counters are --profile's");
	assert_has(t, "prescale_gradients (gradients are summed, then divided by the world size once)");
	assert_has(t, "zero_allow_untested_optimizer (every optimizer here works with every ZeRO stage)");
	assert_has(t, "my_team_setting (not a key hputrain knows)");
	assert_has(t, "zero_optimization.reduce_scatter, zero_optimization.allgather_partitions (each strategy");
	assert_has(t, "zero_optimization.contiguous_gradients (gradients always live in one contiguous buffer)");
	assert_has(t, "zero_optimization.stage3_gather_16bit_weights_on_model_save (--save-params");
	assert_has(t, "optimizer.params.torch_adam (");
	assert_null(strstr(t, "sub_group_size")); /* honoured */
	assert_null(strstr(t, "steps_per_print"));
	free(t);
	/* the names of our options (and the Hugging Face ones for them) at
	 * the top level say where they go, and set nothing */
	t = notes_of("{'seed': 7, 'logging_steps': 10, 'throughput_warmup_steps': 2,"
		     " 'precision': 'bf16', 'learning_rate': 0.1, 'val_check_interval': 2,"
		     " 'no_eval': true, 'per_device_train_batch_size': 8}",
		     NULL, &o);
	assert_int_equal(o.seed, 42);
	assert_int_equal(o.precision, HPU_PREC_FP32);
	assert_true(o.lr == 1e-3);
	assert_has(t, "seed (not a top-level key: this file's hputrain.seed, or the flag --seed, sets it)");
	assert_has(t, "logging_steps (not a top-level key: this file's hputrain.log_every, or the flag --log-every, sets it)");
	assert_has(t, "throughput_warmup_steps (not a key of this file: the flag --throughput-warmup-steps sets it)");
	assert_has(t, "precision (not a top-level key: this file's hputrain.precision, or the flag --precision, sets it)");
	assert_has(t, "learning_rate (not a top-level key: this file's optimizer.params.lr, or the flag --lr, sets it)");
	assert_has(t, "val_check_interval (not a top-level key: this file's hputrain.val_check_interval sets it)");
	assert_has(t, "no_eval (not a top-level key: this file's hputrain.eval (false), or the flag --no-eval, sets it)");
	assert_has(t, "per_device_train_batch_size (not a top-level key: this file's train_micro_batch_size_per_gpu, or the flag --micro-batch-size, sets it)");
	free(t);
	/* DeepSpeed's section keys at the top level name their section; eps
	 * is not taken for a misspelt fp8 */
	t = notes_of("{'eps': 1e-6, 'nesterov': true, 'T_max': 9, 'stage': 2, 'eval': false,"
		     " 'warmup_steps': 5, 'batch_size': 8, 'fp8_margin': 1}",
		     NULL, &o);
	assert_int_equal(o.strategy, HPU_STRATEGY_FAST_DDP);
	assert_has(t, "eps (not a top-level key: this file's optimizer.params.eps, or the flag --eps, sets it)");
	assert_has(t, "nesterov (not a top-level key: this file's optimizer.params.nesterov, or the flag --nesterov, sets it)");
	assert_has(t, "T_max (not a top-level key: this file's scheduler.params.T_max, or the flag --total-steps, sets it)");
	assert_has(t, "stage (not a top-level key: this file's zero_optimization.stage sets it)");
	assert_has(t, "eval (not a top-level key: this file's hputrain.eval, or the flag --no-eval for false, sets it)");
	assert_has(t, "warmup_steps (not a top-level key: this file's scheduler.params.warmup_num_steps, or the flag --warmup-steps, sets it)");
	assert_has(t, "batch_size (not a top-level key: this file's train_batch_size, or the flag --batch-size, sets it)");
	assert_has(t, "fp8_margin (not a top-level key: this file's fp8.margin, or the flag --fp8-margin, sets it)");
	free(t);
	/* a misspelt top-level key is still an error */
	LOAD_ERROR("{'wall_clock_breakdwn': false}", "unknown key 'wall_clock_breakdwn'",
		   "did you mean 'wall_clock_breakdown'");
	/* zero_optimization is strict, as DeepSpeed's */
	LOAD_ERROR("{'zero_optimization': {'my_team_setting': 3}}",
		   "unknown key 'zero_optimization.my_team_setting'");
	/* values DeepSpeed takes that would change the training here */
	LOAD_ERROR("{'optimizer': {'type': 'AdamW', 'params': {'amsgrad': true}}}",
		   "optimizer.params.amsgrad: true is not supported");
	LOAD_ERROR("{'optimizer': {'type': 'SGD', 'params': {'dampening': 0.1}}}",
		   "optimizer.params.dampening: 0.1 is not supported");
}

/* Every bad key of a file in one run, one a line. */
static void test_file_all_errors(void **state)
{
	(void)state;
	char path[64], err[4096] = "";
	hpu_train_opts o, d;
	write_temp("{'train_batch_szie': 8,"
		   " 'zero_optimization': {'stage': 3, 'stage3_prefetch_bucket_sise': 5,"
		   "   'overlap_com': true},"
		   " 'optimizer': {'type': 'AdamW', 'params': {'lr': 'fast', 'betas': [0.9]}},"
		   " 'fp16': {'loss_scail': 0}, 'hputrain': {'epoch': 2}}",
		   path);
	hpu__opts_defaults(&o);
	d = o;
	assert_int_equal(hpu__opts_load_file(&o, path, err, sizeof err), -1);
	unlink(path);
	printf("  -> \"%s\"\n", err);
	assert_memory_equal(&o, &d, sizeof o);
	char head[128];
	snprintf(head, sizeof head, "%s has 7 errors:\n  ", path);
	assert_has(err, head);
	assert_has(err, "\n  unknown key 'train_batch_szie' in");
	assert_has(err, "(did you mean 'train_batch_size'?)");
	assert_has(err, "\n  unknown key 'zero_optimization.stage3_prefetch_bucket_sise'");
	assert_has(err, "\n  unknown key 'zero_optimization.overlap_com' in");
	assert_has(err, "optimizer.params.lr: expected a number, got a string \"fast\"");
	assert_has(err, "optimizer.params.betas: expected two numbers");
	assert_has(err, "\n  unknown key 'fp16.loss_scail'");
	assert_has(err, "\n  unknown key 'hputrain.epoch'");
	int lines = 0;
	for (const char *c = err; *c; c++)
		lines += *c == '\n';
	assert_int_equal(lines, 7);
}

/* Lightning's precision and strategy names; DeepSpeed's communication_data_type, amp,
 * and the sizes whose 0 means something in DeepSpeed. */
static void test_precision_names_and_zero_sizes(void **state)
{
	(void)state;
	static const struct {
		const char *name;
		hpu_precision p;
	} names[] = {{"32", HPU_PREC_FP32},           {"32-true", HPU_PREC_FP32},
		     {"fp32", HPU_PREC_FP32},         {"bf16", HPU_PREC_BF16_MIXED},
		     {"bf16-mixed", HPU_PREC_BF16_MIXED}, {"16-mixed", HPU_PREC_FP16_MIXED},
		     {"16", HPU_PREC_FP16_MIXED},     {"fp8", HPU_PREC_FP8}};
	hpu_train_opts o;
	char err[512];
	int stop;
	for (size_t k = 0; k < sizeof names / sizeof *names; k++) {
		hpu__opts_defaults(&o);
		assert_int_equal(parse(&o, ARGS("--precision", (char *)names[k].name, "m.so"),
				       &stop, err, sizeof err), 0);
		assert_int_equal(o.precision, names[k].p);
	}
	EXPECT_ERROR(ARGS("--precision", "bf16-true"), "--precision", "bf16-true",
		     "bf16-mixed", "32-true", "the master weights stay fp32 here (bf16-mixed)");
	load_ok("{'hputrain': {'precision': '32-true'}}", &o);
	assert_int_equal(o.precision, HPU_PREC_FP32);
	/* and its strategy names */
	static const struct {
		const char *name;
		hpu_strategy s;
	} strategies[] = {{"hpu_parallel", HPU_STRATEGY_DDP},
			  {"deepspeed_stage_1", HPU_STRATEGY_ZERO1},
			  {"deepspeed_stage_2", HPU_STRATEGY_ZERO2},
			  {"deepspeed_stage_3", HPU_STRATEGY_ZERO3}};
	for (size_t k = 0; k < sizeof strategies / sizeof *strategies; k++) {
		hpu__opts_defaults(&o);
		assert_int_equal(parse(&o, ARGS("--strategy", (char *)strategies[k].name, "m.so"),
				       &stop, err, sizeof err), 0);
		assert_int_equal(o.strategy, strategies[k].s);
	}
	/* Lightning's names that mean something else here say what does it */
	EXPECT_ERROR(ARGS("--strategy", "deepspeed_stage_2_offload"), "--strategy",
		     "deepspeed_stage_2_offload", "zero3", "hpu_parallel, deepspeed_stage_1",
		     "here: zero1-2 with --offload-optimizer cpu");
	EXPECT_ERROR(ARGS("--strategy", "deepspeed_stage_3_offload"),
		     "zero3 with --offload-optimizer cpu --offload-param cpu");
	EXPECT_ERROR(ARGS("--strategy", "hpu_single"), "one worker is --devices 1");
	EXPECT_ERROR(ARGS("--strategy", "ddpp"), "--strategy", "ddpp");
	load_ok("{'hputrain': {'strategy': 'deepspeed_stage_3'}}", &o);
	assert_int_equal(o.strategy, HPU_STRATEGY_ZERO3);
	load_ok("{'hputrain': {'precision': 'bf16'}}", &o);
	assert_int_equal(o.precision, HPU_PREC_BF16_MIXED);
	load_ok("{'amp': {'enabled': true, 'opt_level': 'O1'}}", &o);
	assert_int_equal(o.precision, HPU_PREC_FP16_MIXED);
	load_ok("{'bfloat16': {'enabled': true}}", &o);
	assert_int_equal(o.precision, HPU_PREC_BF16_MIXED);
	load_ok("{'communication_data_type': 'bf16'}", &o);
	assert_int_equal(o.grad_comm_dtype, HPU_COMM_BF16);
	/* fp16 is 16-mixed's (hpu__opts_resolve refuses it at any other) */
	load_ok("{'communication_data_type': 'fp16'}", &o);
	assert_int_equal(o.grad_comm_dtype, HPU_COMM_FP16);
	LOAD_ERROR("{'communication_data_type': 'fp8'}", "communication_data_type", "fp8");
	/* DeepSpeed's older boolean (its getting-started page's): stage 1,
	 * or 0 (it was "expected an object, got true") */
	load_ok("{'zero_optimization': true}", &o);
	assert_int_equal(o.strategy, HPU_STRATEGY_ZERO1);
	load_ok("{'zero_optimization': false}", &o);
	assert_int_equal(o.strategy, HPU_STRATEGY_DDP);
	load_ok("{'zero_optimization': {'reduce_bucket_size': 0, 'allgather_bucket_size': 0,"
		" 'stage3_max_live_parameters': 0, 'sub_group_size': 0,"
		" 'stage3_prefetch_bucket_size': 0, 'stage3_param_persistence_threshold': 0}}",
		&o);
	assert_int_equal(o.reduce_bucket, 0);
	assert_int_equal(o.allgather_bucket, 0);
	assert_int_equal(o.max_live_params, 0);
	assert_int_equal(o.sub_group_size, 0);
	/* the short names DeepSpeed also accepts */
	load_ok("{'zero_optimization': {'prefetch_bucket_size': 7, 'param_persistence_threshold': 8,"
		" 'max_live_parameters': 9}}",
		&o);
	assert_int_equal(o.prefetch_bucket, 7);
	assert_int_equal(o.persistence_threshold, 8);
	assert_int_equal(o.max_live_params, 9);
}

/* The four bad files the issue names, and the other kinds of error. */
static void test_file_errors(void **state)
{
	(void)state;
	/* an unknown key, with the closest known one */
	LOAD_ERROR("{'zero_optimization': {'stgae': 2}}",
		   "unknown key 'zero_optimization.stgae'",
		   "(did you mean 'stage'?)");
	LOAD_ERROR("{'train_batch_sizes': 2}", "'train_batch_sizes'",
		   "did you mean 'train_batch_size'");
	LOAD_ERROR("{'zero_optimization': {'frobnicate': 2}}",
		   "unknown key 'zero_optimization.frobnicate'");
	/* a stage out of range */
	LOAD_ERROR("{'zero_optimization': {'stage': 4}}",
		   "zero_optimization.stage: 4 is out of range 0..3");
	LOAD_ERROR("{'zero_optimization': {'stage': -1}}",
		   "zero_optimization.stage", "-1");
	/* a value that is not a number */
	LOAD_ERROR("{'zero_optimization': {'stage': 'two'}}",
		   "zero_optimization.stage: expected a number, got a string "
		   "\"two\"");
	LOAD_ERROR("{'train_batch_size': true}", "train_batch_size",
		   "expected a number, got true");
	LOAD_ERROR("{'gradient_clipping': null}", "gradient_clipping",
		   "got null");
	LOAD_ERROR("{'zero_optimization': {'overlap_comm': 'yes'}}",
		   "zero_optimization.overlap_comm", "true or false");
	LOAD_ERROR("{'zero_optimization': 2}", "zero_optimization",
		   "expected an object, got a number 2");
	/* "auto" where no flag or default can stand for it */
	LOAD_ERROR("{'zero_optimization': {'stage': 'auto'}}",
		   "zero_optimization.stage: \"auto\" is not supported; give a number");
	LOAD_ERROR("{'optimizer': {'type': 'auto'}}", "optimizer.type", "\"auto\"");
	/* integers */
	LOAD_ERROR("{'train_batch_size': 2.5}", "train_batch_size", "2.5",
		   "not an integer");
	LOAD_ERROR("{'train_batch_size': 0}", "train_batch_size",
		   "out of range");
	LOAD_ERROR("{'gradient_clipping': -1}", "gradient_clipping", "-1");
	/* a value holding a newline still makes one line */
	LOAD_ERROR("{'hputrain': {'strategy': 'a\\nb'}}", "hputrain.strategy");
	LOAD_ERROR("{'zero_optimization': {'stage': 1, 'stage': 2}}",
		   "zero_optimization.stage", "twice");
	LOAD_ERROR("[1, 2]", "expected a JSON object", "an array");
}

static void test_file_syntax_and_io(void **state)
{
	(void)state;
	char path[64], err[512];
	hpu_train_opts o;
	/* the error is on line 3 */
	write_temp("{\n  'train_batch_size': 8,\n  'gradient_clipping' 1.0\n}\n",
		   path);
	hpu__opts_defaults(&o);
	assert_int_equal(hpu__opts_load_file(&o, path, err, sizeof(err)), -1);
	printf("  -> \"%s\"\n", err);
	assert_non_null(strstr(err, path));
	assert_non_null(strstr(err, "line 3"));
	assert_non_null(strstr(err, "JSON syntax error"));
	assert_null(strchr(err, '\n'));
	unlink(path);

	LOAD_ERROR("{'train_batch_size': 8,", "line 1", "ends too early");
	LOAD_ERROR("", "JSON syntax error");
	LOAD_ERROR("{'train_batch_size': 8}\n}", "line 2", "JSON syntax error");
	LOAD_ERROR("{'a': 1,\n\n 'b' 2}", "line 3", "JSON syntax error");
	/* a trailing comma is named where it is (it said "the file ends too early") */
	LOAD_ERROR("{'train_batch_size': 8,}", "line 1, column 23",
		   "JSON syntax error: a comma before '}' (JSON allows no trailing comma)");
	LOAD_ERROR("{'a': [1,\n 2, ], 'b': 'x,}'}", "line 2, column 3", "a comma before ']'");
	/* hjson's comments (DeepSpeed's reader takes them): named as such,
	 * where they start (it said "JSON syntax error near '/ comment'",
	 * one column on) */
	LOAD_ERROR("{\n  // comment\n  'train_batch_size': 8}", "line 2, column 3",
		   "a comment: JSON has none");
	LOAD_ERROR("{\n  'train_batch_size': 8 /* c */}", "line 2, column 25", "a comment");
	LOAD_ERROR("{\n# c\n'train_batch_size': 8}", "line 2, column 1", "a comment");
	/* a missing comma, where hjson takes the line break for one (Optimum
	 * Habana's llama2 ZeRO-3 config): named (it said "near '\"timers\"'")
	 * and, for a missing ':', that instead */
	LOAD_ERROR("{\n  'zero_optimization': {'stage': 3}\n  'timers': {}\n}",
		   "line 3, column 3", "a comma is missing before this value (DeepSpeed reads its "
		   "file with hjson, which takes the line break for one");
	LOAD_ERROR("{'a': [1 2]}", "column 10", "a comma is missing before this value");
	LOAD_ERROR("{'a': 1,\n 'b' 2}", "line 2, column 6", "a ':' after the key is missing");
	/* strings in an array are values, not keys */
	LOAD_ERROR("{'x': ['add',\n 'mul'\n 'matmul']}", "line 3, column 2",
		   "a comma is missing before this value (DeepSpeed");
	/* text after the root object: no comma fixes that */
	LOAD_ERROR("{'a': 1}\n{'b': 2}", "line 2, column 1",
		   "text after the end of the file's object");

	err[0] = 0;
	assert_int_equal(hpu__opts_load_file(&o, "/nonexistent/x.json", err,
					     sizeof(err)), -1);
	printf("  -> \"%s\"\n", err);
	assert_non_null(strstr(err, "/nonexistent/x.json"));
	assert_non_null(strstr(err, strerror(ENOENT)));
	assert_int_equal(hpu__opts_load_file(&o, "/tmp", err, sizeof(err)), -1);
	printf("  -> \"%s\"\n", err);
	assert_non_null(strstr(err, strerror(EISDIR)));
}

/* A FIFO named as the config file is refused at once (not waited on for
 * a writer), and so is any other file that is not a regular one; a NUL
 * byte makes a file not text. */
static void test_file_not_regular(void **state)
{
	(void)state;
	char fifo[64] = "/tmp/hpu-test-config-fifo-XXXXXX", err[512] = "";
	int fd = mkstemp(fifo);
	assert_true(fd >= 0);
	close(fd);
	unlink(fifo);
	assert_int_equal(mkfifo(fifo, 0600), 0);
	hpu_train_opts o;
	hpu__opts_defaults(&o);
	alarm(10); /* a hang fails the test instead of blocking ctest */
	int rc = hpu__opts_load_file(&o, fifo, err, sizeof err);
	printf("  -> \"%s\"\n", err);
	assert_int_equal(rc, -1);
	assert_non_null(strstr(err, fifo));
	assert_non_null(strstr(err, "not a regular file (a FIFO)"));
	int stop;
	err[0] = 0;
	assert_int_equal(parse(&o, ARGS("--config", fifo, "m.so"), &stop, err, sizeof err), -1);
	printf("  -> \"%s\"\n", err);
	assert_non_null(strstr(err, fifo));
	assert_non_null(strstr(err, "not a regular file (a FIFO)"));
	char *buf = NULL;
	size_t len;
	const char *why = hpu__read_file(fifo, &buf, &len); /* QUANT_CONFIG's reader */
	assert_non_null(why);
	assert_string_equal(why, "not a regular file (a FIFO)");
	alarm(0);
	unlink(fifo);
	assert_int_equal(hpu__opts_load_file(&o, "/dev/null", err, sizeof err), -1);
	printf("  -> \"%s\"\n", err);
	assert_non_null(strstr(err, "/dev/null: not a regular file (a character device)"));

	char path[64];
	write_temp("{'epochs': 2}", path);
	FILE *f = fopen(path, "a");
	assert_non_null(f);
	fputc(0, f);
	fclose(f);
	assert_int_equal(hpu__opts_load_file(&o, path, err, sizeof err), -1);
	printf("  -> \"%s\"\n", err);
	assert_non_null(strstr(err, path));
	assert_non_null(strstr(err, "NUL byte"));
	why = hpu__read_file(path, &buf, &len);
	assert_non_null(why);
	assert_non_null(strstr(why, "NUL byte"));
	unlink(path);
}

/* --config through the flags: a flag beats the file in either order. */
static void test_flags_beat_file(void **state)
{
	(void)state;
	char path[64], cfg[80], err[512];
	int stop;
	write_temp("{'optimizer': {'type': 'SGD', 'params': {'lr': 0.5,"
		   " 'momentum': 0.7}}, 'train_batch_size': 64,"
		   " 'zero_optimization': {'stage': 2, 'overlap_comm': true},"
		   " 'hputrain': {'epochs': 4}}",
		   path);
	snprintf(cfg, sizeof(cfg), "--config=%s", path);
	hpu_train_opts a, b;
	hpu__opts_defaults(&a);
	hpu__opts_defaults(&b);
	assert_int_equal(parse(&a, ARGS("--lr", "0.1", "--no-overlap-comm",
					"--strategy", "ddp", "--config", path,
					"model.so"),
			       &stop, err, sizeof(err)), 0);
	assert_int_equal(parse(&b, ARGS(cfg, "--lr", "0.1", "--strategy", "ddp",
					"--no-overlap-comm", "model.so"),
			       &stop, err, sizeof(err)), 0);
	unlink(path);
	hpu_train_opts *both[] = {&a, &b};
	for (int k = 0; k < 2; k++) {
		hpu_train_opts *o = both[k];
		assert_true(o->lr == 0.1);
		assert_int_equal(o->strategy, HPU_STRATEGY_DDP);
		assert_int_equal(o->overlap_comm, 0);
		/* what no flag set comes from the file */
		assert_int_equal(o->optimizer, HPU_OPTIM_SGD);
		assert_true(o->momentum == 0.7);
		assert_int_equal(o->batch_size, 64);
		assert_int_equal(o->epochs, 4);
		assert_string_equal(o->config, path);
	}

	/* --bucket-cap-mb is the flag for reduce_bucket_size */
	write_temp("{'zero_optimization': {'reduce_bucket_size': 1000}}", path);
	hpu__opts_defaults(&a);
	assert_int_equal(parse(&a, ARGS("--bucket-cap-mb", "1", "--config",
					path),
			       &stop, err, sizeof(err)), 0);
	assert_int_equal(a.reduce_bucket, 262144);
	hpu__opts_defaults(&a);
	assert_int_equal(parse(&a, ARGS("--config", path), &stop, err,
			       sizeof(err)), 0);
	assert_int_equal(a.reduce_bucket, 1000);
	unlink(path);

	/* a flag also satisfies WarmupDecayLR's total_num_steps */
	write_temp("{'scheduler': {'type': 'WarmupDecayLR'}}", path);
	hpu__opts_defaults(&a);
	assert_int_equal(parse(&a, ARGS("--total-steps", "50", "--config",
					path),
			       &stop, err, sizeof(err)), 0);
	assert_int_equal(a.sched, HPU_SCHED_WARMUP_DECAY);
	assert_int_equal(a.total_steps, 50);
	unlink(path);

	/* a bad file through --config: the error is the file's */
	hpu__opts_defaults(&a);
	b = a;
	write_temp("{'zero_optimization': {'stage': 9}}", path);
	assert_int_equal(parse(&a, ARGS("--config", path), &stop, err,
			       sizeof(err)), -1);
	unlink(path);
	printf("  -> \"%s\"\n", err);
	assert_non_null(strstr(err, "zero_optimization.stage: 9 is out of range"));
	assert_memory_equal(&a, &b, sizeof(a));
}

/* A file with many keys, one given twice at the end: refused, naming that
 * key once and no other (the check for repeated keys sorts them: 200,000
 * keys take well under a second, where comparing each with all before it
 * took minutes). */
static void test_file_many_keys(void **state)
{
	(void)state;
	enum { N = 200000 };
	char path[] = "/tmp/hpu-cfg-many-XXXXXX", err[512] = "";
	int fd = mkstemp(path);
	assert_true(fd >= 0);
	FILE *f = fdopen(fd, "w");
	assert_non_null(f);
	fprintf(f, "{\"train_batch_size\": 64");
	for (int k = 0; k < N; k++) /* far from every known key: ignored */
		fprintf(f, ", \"k%06d\": %d", k, k);
	fprintf(f, ", \"k%06d\": 1}", N / 2);
	assert_int_equal(fclose(f), 0);
	hpu_train_opts o;
	hpu__opts_defaults(&o);
	int rc = hpu__opts_load_file(&o, path, err, sizeof err);
	unlink(path);
	printf("  -> \"%s\"\n", err);
	assert_int_equal(rc, -1);
	char want[64];
	snprintf(want, sizeof want, ": k%06d: given twice", N / 2);
	assert_non_null(strstr(err, want));
	assert_null(strstr(err, "errors")); /* one error, not "has N errors" */
}

/* The repeated-key finder: the later of two equal keys is marked, in the
 * hputrain section '-' and '_' alike; a key given three times is marked
 * twice. */
static void test_repeated_keys(void **state)
{
	(void)state;
	const char *keys[] = {"b", "max-steps", "a", "b", "max_steps", "c", "b", "a-b"};
	unsigned char rep[8];
	assert_int_equal(hpu__repeated_keys(keys, 8, 0, rep), 2);
	const unsigned char plain[8] = {0, 0, 0, 1, 0, 0, 1, 0};
	assert_memory_equal(rep, plain, 8);
	assert_int_equal(hpu__repeated_keys(keys, 8, 1, rep), 3);
	const unsigned char dashes[8] = {0, 0, 0, 1, 1, 0, 1, 0};
	assert_memory_equal(rep, dashes, 8);
	assert_int_equal(hpu__repeated_keys(keys, 0, 0, rep), 0);
}

/* A string holding a NUL (JSON's \u0000) would be cut short at it: a path
 * "/tmp/a\u0000b" would write /tmp/a. Such a string, as a value or a key,
 * is refused naming the key; "\\u0000" (a backslash, then "u0000") is
 * not a NUL. */
static void test_file_nul(void **state)
{
	(void)state;
	hpu_train_opts o;
	LOAD_ERROR("{'hputrain': {'metrics': '/tmp/a\\u0000b'}}",
		   "hputrain.metrics: the string holds a NUL (\\u0000) or another control character");
	LOAD_ERROR("{'hputrain': {'checkpoint_dir': 'ck\\u0000'}}", "hputrain.checkpoint_dir",
		   "NUL (\\u0000)");
	LOAD_ERROR("{'optimizer': {'type': 'SGD\\u0000x'}}", "optimizer.type", "NUL (\\u0000)");
	LOAD_ERROR("{'hputrain\\u0000x': {'metrics': 'm'}}", "hputrain?x: the key holds", "NUL (\\u0000)");
	LOAD_ERROR("{'hputrain': {'metrics': 'a\\u0001b'}}", "hputrain.metrics", "control character");
	load_ok("{'hputrain': {'metrics': '/tmp/a\\\\u0000b'}}", &o);
	assert_string_equal(o.metrics, "/tmp/a\\u0000b");
}

/* DeepSpeed's older cpu_offload / cpu_offload_params beside the
 * offload_optimizer / offload_param they stand for: refused when they ask
 * for different places (cpu_offload won, in silence), taken when they
 * agree or the older one is false. */
static void test_file_cpu_offload_beside(void **state)
{
	(void)state;
	hpu_train_opts o;
	LOAD_ERROR("{'zero_optimization': {'stage': 2, 'cpu_offload': true, "
		   "'offload_optimizer': {'device': 'nvme', 'nvme_path': '/tmp'}}}",
		   "zero_optimization.cpu_offload: asks for cpu, but "
		   "zero_optimization.offload_optimizer.device asked for nvme",
		   "cpu_offload is DeepSpeed's older name for offload_optimizer");
	LOAD_ERROR("{'zero_optimization': {'stage': 3, 'offload_param': {'device': 'none'}, "
		   "'cpu_offload_params': true}}",
		   "zero_optimization.cpu_offload_params: asks for cpu, but "
		   "zero_optimization.offload_param.device asked for none");
	LOAD_ERROR("{'zero_optimization': {'stage': 3, 'cpu_offload_param': true, "
		   "'offload_param': {'device': 'nvme', 'nvme_path': '/tmp'}}}",
		   "zero_optimization.cpu_offload_param: asks for cpu, but");
	load_ok("{'zero_optimization': {'stage': 2, 'cpu_offload': true, "
		"'offload_optimizer': {'device': 'cpu'}}}", &o);
	assert_int_equal(o.offload_optimizer, HPU_OFFLOAD_CPU);
	load_ok("{'zero_optimization': {'stage': 2, 'cpu_offload': false, "
		"'offload_optimizer': {'device': 'nvme', 'nvme_path': '/tmp'}}}", &o);
	assert_int_equal(o.offload_optimizer, HPU_OFFLOAD_NVME);
}

/* --config (after the flags in `before`) loads but hpu__opts_resolve
 * refuses it; returns the error, which names the file. */
static const char *resolve_error(const char *json, char **before)
{
	static char err[2048];
	char path[64];
	hpu_train_opts o;
	write_temp(json, path);
	hpu__opts_defaults(&o);
	err[0] = 0;
	for (int k = 0; before && before[k]; k += 2)
		assert_int_equal(hpu__opts_set(&o, before[k], before[k + 1], err, sizeof err), 0);
	int rc = hpu__opts_set(&o, "config", path, err, sizeof err);
	if (rc != 0)
		fail_msg("%s did not load: %s", json, err);
	rc = hpu__opts_resolve(&o, 1, err, sizeof err);
	unlink(path);
	printf("  -> \"%s\"\n", err);
	assert_int_equal(rc, -1);
	assert_has(err, path);
	return err;
}

/* Offload a config file asked for and its strategy cannot take: the
 * error names the file's keys, not flags that were never given. */
static void test_file_offload_refusals_name_keys(void **state)
{
	(void)state;
	const char *e = resolve_error("{'zero_optimization': {'stage': 2, 'offload_param': "
				      "{'device': 'cpu'}}}", NULL);
	assert_has(e, "zero_optimization.offload_param.device cpu works with zero3 only "
		      "(DeepSpeed's stage 3), not zero_optimization.stage 2 (config file ");
	assert_null(strstr(e, "--"));
	e = resolve_error("{'zero_optimization': {'stage': 0, 'cpu_offload': true}}", NULL);
	assert_has(e, "zero_optimization.cpu_offload true needs a ZeRO strategy (zero1, zero2 or "
		      "zero3), not zero_optimization.stage 0 (config file ");
	assert_null(strstr(e, "--"));
	e = resolve_error("{'hputrain': {'strategy': 'fast_ddp'}, 'zero_optimization': "
			  "{'offload_optimizer': {'device': 'cpu'}}}", NULL);
	assert_has(e, "zero_optimization.offload_optimizer.device cpu needs a ZeRO strategy "
		      "(zero1, zero2 or zero3), not hputrain.strategy fast_ddp (config file ");
	e = resolve_error("{'zero_optimization': {'stage': 2, 'offload_optimizer': "
			  "{'device': 'nvme'}}}", NULL);
	assert_has(e, "zero_optimization.offload_optimizer.device nvme needs "
		      "zero_optimization.offload_optimizer.nvme_path (or --nvme-path DIR) (config file ");
	/* the batch triple disagreeing: the file named too (it was not) */
	e = resolve_error("{'train_batch_size': 32, 'train_micro_batch_size_per_gpu': 16, "
			  "'gradient_accumulation_steps': 4}", NULL);
	assert_has(e, "train_batch_size 32 != train_micro_batch_size_per_gpu 16 x "
		      "gradient_accumulation_steps 4 x world size 1 = 64");
	/* a flag beside a key: each named as it was given */
	char *flag[] = {"offload-param", "cpu", NULL};
	e = resolve_error("{'zero_optimization': {'stage': 1}}", flag);
	assert_has(e, "--offload-param cpu works with zero3 only (DeepSpeed's stage 3), not "
		      "zero_optimization.stage 1 (config file ");
	/* a floor above the first dynamic scale: an overflow raised the
	 * scale to it (65536 -> 1e6), accepted in silence */
	e = resolve_error("{'fp16': {'enabled': true, 'min_loss_scale': 1000000}}", NULL);
	assert_has(e, "fp16.min_loss_scale 1e+06 is above the first loss scale, 2^16 = 65536 "
		      "(--initial-scale-power 16): the first overflow would raise the scale to it");
}

/* Flags given that the run's other choices leave unread are noted (they
 * were taken in silence); used ones are not, nor a config file's keys
 * (DeepSpeed's templates carry sections a run does not use). */
static void test_unread_options_noted(void **state)
{
	(void)state;
	hpu_train_opts o;
	char *before[] = {"optimizer", "adamw", "momentum", "0.5", "graphs-warmup", "2",
			  "max-steps", "4", "stop-at-step", "50", "loss-scale", "128",
			  "hysteresis", "3", NULL};
	char *t = notes_of("{\"fp16\": {\"enabled\": false, \"loss_scale_window\": 100}}", before, &o);
	assert_has(t, "hpulaunch: note: --loss-scale, --hysteresis have no effect at --precision fp32: "
		      "only 16-mixed scales the loss\n");
	assert_null(strstr(t, "--loss-scale-window"));
	assert_has(t, "hpulaunch: note: --momentum has no effect with --optimizer adamw or adam: "
		      "they are SGD's\n");
	assert_has(t, "hpulaunch: note: --graphs-warmup has no effect without --graphs\n");
	assert_has(t, "hpulaunch: note: --stop-at-step 50 is not before --max-steps 4");
	free(t);
	/* a static scale leaves the dynamic scale's options unread, and a
	 * mixed precision --grad-comm-dtype (both were taken in silence) */
	char *fixed[] = {"precision", "16-mixed", "loss-scale", "128", "hysteresis", "3",
			 "min-loss-scale", "4", "grad-comm-dtype", "bf16", NULL};
	t = notes_of("{}", fixed, &o);
	assert_has(t, "hpulaunch: note: --hysteresis, --min-loss-scale have no effect with a static "
		      "--loss-scale (only the dynamic scale has them)\n");
	assert_has(t, "hpulaunch: note: --grad-comm-dtype has no effect at --precision 16-mixed: the "
		      "gradients are fp16 already and travel so\n");
	free(t);
	/* before --max-steps, but with nowhere to save: it stopped and
	 * saved nothing, silently */
	char *nowhere[] = {"max-steps", "10", "stop-at-step", "3", NULL};
	t = notes_of("{}", nowhere, &o);
	assert_has(t, "hpulaunch: warning: --stop-at-step 3 without --checkpoint-dir: the run stops "
		      "after step 3 and saves no checkpoint to resume from\n");
	free(t);
	char *somewhere[] = {"max-steps", "10", "stop-at-step", "3", "checkpoint-dir", "ck", NULL};
	t = notes_of("{}", somewhere, &o);
	assert_null(strstr(t, "--stop-at-step"));
	free(t);
	/* --allow-tf32 on a CPU device (accepted, as PyTorch's flag is on a
	 * CPU, and said only under the worker's --verbose) */
	char *tf32[] = {"allow-tf32", NULL, "device", "cpu-strict", NULL};
	t = notes_of("{}", tf32, &o);
	assert_has(t, "hpulaunch: note: --allow-tf32 has no effect on --device cpu-strict: its fp32 "
		      "products stay fp32\n");
	free(t);
	char *tf32_cuda[] = {"allow-tf32", NULL, "device", "cuda", NULL};
	t = notes_of("{}", tf32_cuda, &o);
	assert_null(strstr(t, "no effect"));
	free(t);
	char *used[] = {"optimizer", "sgd", "momentum", "0.5", "graphs-warmup", "2", NULL};
	t = notes_of("{\"fp16\": {\"enabled\": true, \"loss_scale\": 128}, "
		     "\"use_hpu_graphs_for_training\": true}", used, &o);
	assert_null(strstr(t, "no effect"));
	free(t);
}

/* More flags the run never reads (each was taken in silence, found by
 * the options review): another strategy's tuning, the host tier's bound
 * without offload, Adam's betas under sgd, --total-steps beside a
 * schedule without a length, --save-params-format and --profile-filename
 * alone, what --eval-only never trains with. One option of two names is
 * named once. */
static void test_unread_more_noted(void **state)
{
	(void)state;
	hpu_train_opts o;
	char *before[] = {"strategy", "zero1", "prefetch-bucket-size", "10", "bucket-cap-mb", "2",
			  "host-memory", "1GiB", "optimizer", "sgd", "beta1", "0.5",
			  "total-steps", "5", "save-params-format", "raw", "profile-filename", "x",
			  NULL};
	char *t = notes_of("{}", before, &o);
	assert_has(t, "hpulaunch: note: --prefetch-bucket-size has no effect under --strategy "
		      "zero1: they are zero3's\n");
	assert_has(t, "hpulaunch: note: --reduce-bucket-size has no effect under --strategy zero1: "
		      "it (or --bucket-cap-mb) is ddp's and zero2's\n");
	assert_has(t, "hpulaunch: note: --host-memory has no effect without --offload-optimizer or "
		      "--offload-param: it bounds their host tier\n");
	assert_has(t, "hpulaunch: note: --beta1 has no effect with --optimizer sgd: they are "
		      "Adam's and AdamW's\n");
	assert_has(t, "hpulaunch: note: --total-steps has no effect without --scheduler "
		      "warmup_decay or cosine\n");
	assert_has(t, "hpulaunch: note: --save-params-format has no effect without --save-params\n");
	assert_has(t, "hpulaunch: note: --profile-filename has no effect without --profile\n");
	free(t);
	char *eval[] = {"eval-only", NULL, "lr", "5", "max-steps", "3", "stop-at-step", "2",
			"val-fraction", "0.5", "eval-every", "2", "no-eval", NULL, NULL};
	t = notes_of("{}", eval, &o);
	assert_has(t, "hpulaunch: note: --max-steps, --lr, --eval-every, --stop-at-step have no "
		      "effect with --eval-only: it trains nothing\n");
	assert_has(t, "hpulaunch: note: --no-eval, --val-fraction have no effect with --eval-only: "
		      "it evaluates the test split\n");
	assert_null(strstr(t, "saves no checkpoint"));
	free(t);
	/* --keep-best where checkpoints and validations seldom meet */
	char *keep[] = {"keep-best", "val_loss,1", "eval-every", "4", "checkpoint-every", "6",
			"checkpoint-dir", "ck", NULL};
	t = notes_of("{}", keep, &o);
	assert_has(t, "hpulaunch: note: --keep-best ranks the checkpoints saved where the run "
		      "validates: with --eval-every 4 and --checkpoint-every 6, every 12 steps' (and "
		      "the last's if it validates); make --eval-every a divisor of "
		      "--checkpoint-every\n");
	free(t);
	char *keep_ok[] = {"keep-best", "val_loss,1", "eval-every", "3", "checkpoint-every", "6",
			   "checkpoint-dir", "ck", NULL};
	t = notes_of("{}", keep_ok, &o);
	assert_null(strstr(t, "--keep-best"));
	free(t);
	/* used where they are read: no note */
	char *used[] = {"strategy", "zero3", "prefetch-bucket-size", "10", "offload-optimizer",
			"cpu", "host-memory", "1GiB", NULL};
	t = notes_of("{}", used, &o);
	assert_null(strstr(t, "no effect"));
	free(t);
}

/* Refused at resolve: Nesterov without momentum however spelled (only a
 * file leaving momentum out was refused), a second --config (its keys
 * were mixed with the first's). */
static void test_contradictions_refused(void **state)
{
	(void)state;
	hpu_train_opts o;
	char err[1024] = "";
	hpu__opts_defaults(&o);
	assert_int_equal(hpu__opts_set(&o, "optimizer", "sgd", err, sizeof err), 0);
	assert_int_equal(hpu__opts_set(&o, "momentum", "0", err, sizeof err), 0);
	assert_int_equal(hpu__opts_set(&o, "nesterov", NULL, err, sizeof err), 0);
	assert_int_equal(hpu__opts_resolve(&o, 1, err, sizeof err), -1);
	assert_has(err, "--nesterov needs momentum, not --momentum 0: Nesterov momentum "
			"without one is plain SGD (torch.optim.SGD refuses it)");
	char path[64];
	write_temp("{\"optimizer\": {\"type\": \"SGD\", \"params\": {\"lr\": 0.05, "
		   "\"momentum\": 0, \"nesterov\": true}}}",
		   path);
	hpu__opts_defaults(&o);
	assert_int_equal(hpu__opts_set(&o, "config", path, err, sizeof err), 0);
	assert_int_equal(hpu__opts_resolve(&o, 1, err, sizeof err), -1);
	assert_has(err, "optimizer.params.nesterov true needs momentum, not "
			"optimizer.params.momentum 0 (config file ");
	assert_int_equal(hpu__opts_set(&o, "config", path, err, sizeof err), -1);
	char want[300];
	snprintf(want, sizeof want, "--config given twice (%s, then %s): give one file", path, path);
	assert_has(err, want);
	unlink(path);
	/* parameters to nvme without a path: the parameters' own flag named
	 * (it named only --nvme-path) */
	hpu__opts_defaults(&o);
	assert_int_equal(hpu__opts_set(&o, "strategy", "zero3", err, sizeof err), 0);
	assert_int_equal(hpu__opts_set(&o, "offload-param", "nvme", err, sizeof err), 0);
	assert_int_equal(hpu__opts_resolve(&o, 1, err, sizeof err), -1);
	assert_has(err, "--offload-param nvme needs --param-nvme-path DIR, or --nvme-path DIR for "
			"both tiers (offload_param.nvme_path)");
}

/* A refusal of a value from the file names its key and the file (they
 * said "--checkpoint-every needs --checkpoint-dir", "--early-stop ...",
 * flags the user never passed). */
static void test_file_refusals_name_keys(void **state)
{
	(void)state;
	static const struct {
		const char *json, *want;
	} C[] = {
		{"{\"hputrain\": {\"checkpoint_every\": 2}}",
		 "hputrain.checkpoint_every needs --checkpoint-dir DIR (config file "},
		{"{\"hputrain\": {\"early_stop\": \"val_loss,2\"}}",
		 "hputrain.early_stop val_loss,2 watches the validation: add --eval-every N or "
		 "--eval-every-epochs N (config file "},
		{"{\"hputrain\": {\"keep_best\": \"val_loss,2\", \"checkpoint_dir\": \"ck\"}}",
		 "hputrain.keep_best val_loss,2 ranks the checkpoints by the validation: add "
		 "--eval-every N or --eval-every-epochs N (config file "},
		{"{\"hputrain\": {\"val_fraction\": 0.25}}",
		 "hputrain.val_fraction 0.25 holds out samples that nothing validates on: add "
		 "--eval-every N or --eval-every-epochs N (config file "},
	};
	for (size_t i = 0; i < sizeof C / sizeof C[0]; i++) {
		hpu_train_opts o;
		char path[64], err[1024] = "";
		write_temp(C[i].json, path);
		hpu__opts_defaults(&o);
		int rc = hpu__opts_set(&o, "config", path, err, sizeof err);
		if (rc == 0)
			rc = hpu__opts_resolve(&o, 1, err, sizeof err);
		unlink(path);
		printf("  %s -> %s\n", C[i].json, err);
		assert_int_equal(rc, -1);
		assert_has(err, C[i].want);
	}
}

/* The offload tier's flags with nothing to tune: the nvme ones without
 * nvme offload, the optimizer's beside parameters-only nvme, --nvme-path
 * beside --param-nvme-path when only the parameters go to nvme. */
static void test_unread_offload_noted(void **state)
{
	(void)state;
	hpu_train_opts o;
	char *none[] = {"strategy", "zero2", "nvme-path", "/tmp", "sub-group-size", "1000",
			"offload-buffer-count", "2", "aio-queue-depth", "4", NULL};
	char *t = notes_of("{}", none, &o);
	assert_has(t, "hpulaunch: note: --nvme-path, --sub-group-size, --offload-buffer-count, "
		      "--aio-queue-depth have no effect without --offload-optimizer nvme or "
		      "--offload-param nvme\n");
	free(t);
	char *param[] = {"strategy", "zero3", "offload-param", "nvme", "nvme-path", "/tmp",
			 "param-nvme-path", "/var/tmp", "sub-group-size", "1000", NULL};
	t = notes_of("{}", param, &o);
	assert_has(t, "hpulaunch: note: --sub-group-size has no effect without "
		      "--offload-optimizer nvme\n");
	assert_has(t, "hpulaunch: note: --nvme-path has no effect beside --param-nvme-path "
		      "when only the parameters go to nvme\n");
	free(t);
	char *optim[] = {"strategy", "zero3", "offload-optimizer", "nvme", "nvme-path", "/tmp",
			 "param-buffer-count", "3", "aio-queue-depth", "4", NULL};
	t = notes_of("{}", optim, &o);
	assert_has(t, "hpulaunch: note: --param-buffer-count has no effect without "
		      "--offload-param nvme\n");
	assert_null(strstr(t, "--aio-queue-depth"));
	assert_null(strstr(t, "--nvme-path"));
	free(t);
	/* a config file's keys are not noted */
	t = notes_of("{'zero_optimization': {'stage': 2, 'sub_group_size': 1e9, "
		     "'offload_optimizer': {'device': 'cpu', 'nvme_path': '/tmp', "
		     "'buffer_count': 4}}, 'aio': {'block_size': 1048576}}", NULL, &o);
	assert_null(strstr(t, "no effect"));
	free(t);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_file_top_and_zero),
	    cmocka_unit_test(test_warmup_decay_short_total),
	    cmocka_unit_test(test_file_optimizer),
	    cmocka_unit_test(test_file_scheduler),
	    cmocka_unit_test(test_file_precision),
	    cmocka_unit_test(test_file_cpu_offload_beside),
	    cmocka_unit_test(test_file_offload_refusals_name_keys),
	    cmocka_unit_test(test_file_hputrain),
	    cmocka_unit_test(test_file_auto),
	    cmocka_unit_test(test_file_no_effect),
	    cmocka_unit_test(test_file_all_errors),
	    cmocka_unit_test(test_precision_names_and_zero_sizes),
	    cmocka_unit_test(test_file_errors),
	    cmocka_unit_test(test_file_syntax_and_io),
	    cmocka_unit_test(test_file_not_regular),
	    cmocka_unit_test(test_flags_beat_file),
	    cmocka_unit_test(test_file_many_keys),
	    cmocka_unit_test(test_repeated_keys),
	    cmocka_unit_test(test_file_nul),
	    cmocka_unit_test(test_unread_options_noted),
	    cmocka_unit_test(test_unread_more_noted),
	    cmocka_unit_test(test_contradictions_refused),
	    cmocka_unit_test(test_file_refusals_name_keys),
	    cmocka_unit_test(test_unread_offload_noted),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
