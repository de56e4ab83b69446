// The one value of the SDK's src/template/types that E2B's template tests
// import (methods/fromDockerfile.test.ts) and the npm package does not
// export: the steps' types, as the SDK sends them.
export enum InstructionType {
  COPY = 'COPY',
  ENV = 'ENV',
  RUN = 'RUN',
  WORKDIR = 'WORKDIR',
  USER = 'USER',
}
