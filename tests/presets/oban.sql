-- Oban 2.23.0 (Hex `oban`): the oban_jobs table as Oban's PostgreSQL migrations
-- lib/oban/migrations/postgres/v01.ex .. v14.ex leave it (Oban.Migration.up/0 at
-- version 14), in the order the migrations add each column, with their constraints and
-- the indexes kept by the last migration. The prefix ("public" by default) is the
-- schema the test sets as search_path. oban_peers (v11) is not watched and left out.
CREATE TYPE oban_job_state AS ENUM (
  'available',
  'suspended',
  'scheduled',
  'executing',
  'retryable',
  'completed',
  'discarded',
  'cancelled'
);

CREATE TABLE oban_jobs (
  id bigserial PRIMARY KEY,
  state oban_job_state NOT NULL DEFAULT 'available',
  queue text NOT NULL DEFAULT 'default',
  worker text NOT NULL,
  args jsonb NOT NULL DEFAULT '{}',
  errors jsonb[] NOT NULL DEFAULT ARRAY[]::jsonb[],
  attempt integer NOT NULL DEFAULT 0,
  max_attempts integer NOT NULL DEFAULT 20,
  inserted_at timestamp without time zone NOT NULL DEFAULT timezone('UTC', now()),
  scheduled_at timestamp without time zone NOT NULL DEFAULT timezone('UTC', now()),
  attempted_at timestamp without time zone,
  completed_at timestamp without time zone,
  attempted_by text[],
  discarded_at timestamp without time zone,
  priority integer NOT NULL DEFAULT 0,
  tags text[] DEFAULT ARRAY[]::text[],
  meta jsonb DEFAULT '{}',
  cancelled_at timestamp without time zone,
  CONSTRAINT worker_length CHECK (char_length(worker) > 0 AND char_length(worker) < 128),
  CONSTRAINT queue_length CHECK (char_length(queue) > 0 AND char_length(queue) < 128),
  CONSTRAINT positive_max_attempts CHECK (max_attempts > 0),
  CONSTRAINT attempt_range CHECK (attempt between 0 and max_attempts),
  CONSTRAINT non_negative_priority CHECK (priority >= 0) NOT VALID
);

CREATE INDEX oban_jobs_state_queue_priority_scheduled_at_id_index
  ON oban_jobs (state, queue, priority, scheduled_at, id);
CREATE INDEX oban_jobs_args_index ON oban_jobs USING gin (args);
CREATE INDEX oban_jobs_meta_index ON oban_jobs USING gin (meta);
CREATE INDEX oban_jobs_state_cancelled_at_index ON oban_jobs (state, cancelled_at);
CREATE INDEX oban_jobs_state_discarded_at_index ON oban_jobs (state, discarded_at);
