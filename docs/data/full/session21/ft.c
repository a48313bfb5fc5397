#include <sys/mman.h>
#include <stdio.h>
#include <time.h>
#include <string.h>
#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif
double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
int main(int argc,char**argv){
  size_t len=1UL<<30;
  for(int huge=0;huge<2;huge++) for(int r=0;r<3;r++){
    char*p=mmap(0,len,PROT_READ|PROT_WRITE,MAP_PRIVATE|MAP_ANONYMOUS,-1,0);
    if(huge) madvise(p,len,MADV_HUGEPAGE); else madvise(p,len,MADV_NOHUGEPAGE);
    double t=now(); madvise(p,len,MADV_POPULATE_WRITE); double t2=now();
    memset(p,1,len); double t3=now();
    printf("huge=%d populate %.0f MB/s  memset after %.0f MB/s\n",huge,1024/(t2-t),1024/(t3-t2));
    munmap(p,len);
  }
}
